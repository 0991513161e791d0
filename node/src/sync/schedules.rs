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
/// contribution (with its block bytes), computes the chunk's grid and sum, and sends both to
/// everyone. Here the owners run one after another; the result is the concatenation.
pub fn sum_by_owners(contributions: &[&Packed]) -> (Vec<u8>, Vec<i32>) {
    let n = contributions.len();
    let len = contributions.first().map_or(0, |p| p.len());
    let mut grid = Vec::new();
    let mut sum = Vec::new();
    for owner in 0..n {
        let (start, end) = (chunk_start(len, n, owner), chunk_start(len, n, owner + 1));
        let blocks = start / BLOCK..end.div_ceil(BLOCK);
        let mut chunk_grid = vec![EMPTY_BLOCK; blocks.len()];
        for p in contributions {
            for (g, &e) in chunk_grid.iter_mut().zip(&p.exponents[blocks.clone()]) {
                *g = (*g).max(e);
            }
        }
        // `on_grid` indexes the grid by absolute block: lay the chunk's grid there.
        let mut full = vec![EMPTY_BLOCK; len.div_ceil(BLOCK)];
        full[blocks.clone()].copy_from_slice(&chunk_grid);
        let mut chunk_sum = vec![0i32; end - start];
        // Arrival order at an owner is anything: take them last to first.
        for p in contributions.iter().rev() {
            on_grid(p, &full, start..end, &mut chunk_sum);
        }
        grid.extend(chunk_grid);
        sum.extend(chunk_sum);
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
