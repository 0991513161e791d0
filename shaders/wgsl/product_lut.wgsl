// The exact int8 product of four packed pairs through the product table: the oracle twin of
// the DP4A kernel. `mul_lut` is luts/mul_lut.bin itself, 65536 little-endian i16 (131072
// bytes, small enough to stay in a GPU's L1): entry `(a_byte << 8) | b_byte` is `a * b`, and
// word `e >> 1` holds entries `e & ~1` (low half) and `e | 1` (high half). Indices are masked
// to 16 bits, so every lookup is inside the table.

@group(0) @binding(6) var<storage, read> mul_lut: array<u32, 32768>;

fn lut_product(a_byte: u32, b_byte: u32) -> i32 {
    let word = mul_lut[(a_byte << 7u) | (b_byte >> 1u)];
    // Move the wanted half to the top, then sign-extend it with an arithmetic shift.
    let shift = 16u - ((b_byte & 1u) << 4u);
    return bitcast<i32>(word << shift) >> 16u;
}

fn dot4(a: u32, b: u32) -> i32 {
    let p0 = lut_product(a & 0xffu, b & 0xffu);
    let p1 = lut_product((a >> 8u) & 0xffu, (b >> 8u) & 0xffu);
    let p2 = lut_product((a >> 16u) & 0xffu, (b >> 16u) & 0xffu);
    let p3 = lut_product(a >> 24u, b >> 24u);
    return (p0 + p1) + (p2 + p3);
}
