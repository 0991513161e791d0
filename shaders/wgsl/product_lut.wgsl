// The exact int8 product of four packed pairs through the product table: the oracle twin of
// the DP4A kernel. Entry `(a_byte << 8) | b_byte` of `mul_lut` is `a * b` (luts/mul_lut.bin,
// widened to i32 so a lookup needs no sign extension). Indices are masked to 16 bits, so
// they are always inside the 65536-entry table.

@group(0) @binding(6) var<storage, read> mul_lut: array<i32, 65536>;

fn dot4(a: u32, b: u32) -> i32 {
    let p0 = mul_lut[((a << 8u) & 0xff00u) | (b & 0xffu)];
    let p1 = mul_lut[(a & 0xff00u) | ((b >> 8u) & 0xffu)];
    let p2 = mul_lut[((a >> 8u) & 0xff00u) | ((b >> 16u) & 0xffu)];
    let p3 = mul_lut[((a >> 16u) & 0xff00u) | (b >> 24u)];
    return (p0 + p1) + (p2 + p3);
}
