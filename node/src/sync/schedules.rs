//! Other schedules of the same sum, for members that do not hold every contribution. Each
//! gives [`sum_direct`]'s integers (and so its mean) bit for bit, because every term is put on
//! the group's grid on its own before any addition.

use super::*;

/// Where chunk `c` of `n` begins: block-aligned, as even as blocks allow.
pub fn chunk_start(len: usize, n: usize, c: usize) -> usize {
    let blocks = len.div_ceil(BLOCK);
    ((blocks * c / n) * BLOCK).min(len)
}

/// Reduce-scatter, then all-gather: member `c` owns chunk `c`, receives that chunk of every
/// contribution (with its block bytes), computes the chunk's grid and sum
/// ([`super::owners::ChunkSum::of`]), and sends both to everyone. Here the owners run one after
/// another; the result is the concatenation.
pub fn sum_by_owners(contributions: &[&Packed]) -> (Vec<u8>, Vec<i32>) {
    let n = contributions.len();
    let len = contributions.first().map_or(0, |p| p.len());
    let weighted: Vec<(&Packed, u32)> = contributions.iter().map(|p| (*p, 1)).collect();
    let (mut grid, mut sum) = (Vec::new(), Vec::new());
    for owner in 0..n {
        let owned = super::owners::ChunkSum::of(&weighted, super::owners::chunk(len, n, owner));
        grid.extend(owned.grid);
        sum.extend(owned.sum.into_iter().map(|v| i32::try_from(v).expect("a sum of int8 terms fits an i32")));
    }
    (grid, sum)
}

/// A ring: the grid first (a max passed round the ring: associative), then a partial sum
/// passed from member to member starting at `first`, each adding its own terms.
pub fn sum_ring(contributions: &[&Packed], first: usize) -> (Vec<u8>, Vec<i32>) {
    // Passing a partial sum round the ring adds the same terms in the ring's order.
    let n = contributions.len();
    let order: Vec<&Packed> = (0..n).map(|i| contributions[(first + i) % n]).collect();
    sum_direct(&order)
}
