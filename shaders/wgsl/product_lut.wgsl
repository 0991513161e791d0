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

// A word of A prepared once for every B word it meets: each byte's row of the table, as the
// word index of the row's start (`byte << 7`).
alias PreparedA = vec4<u32>;
// A word of B prepared once for every A word it meets: each byte's word within a row
// (`byte >> 1`) and the shift that moves its half of the word to the top (16 or 0).
struct PreparedB {
    word: vec4<u32>,
    shift: vec4<u32>,
}

fn prepare_a(a: u32) -> PreparedA {
    return vec4<u32>(a & 0xffu, (a >> 8u) & 0xffu, (a >> 16u) & 0xffu, a >> 24u) << vec4<u32>(7u);
}

fn prepare_b(b: u32) -> PreparedB {
    let bytes = vec4<u32>(b & 0xffu, (b >> 8u) & 0xffu, (b >> 16u) & 0xffu, b >> 24u);
    return PreparedB(bytes >> vec4<u32>(1u), vec4<u32>(16u) - ((bytes & vec4<u32>(1u)) << vec4<u32>(4u)));
}

// The same four lookups as `dot4`, from prepared words: per product an OR, a load, two shifts.
fn dot4_prepared(a: PreparedA, b: PreparedB) -> i32 {
    let words = vec4<u32>(mul_lut[a.x | b.word.x], mul_lut[a.y | b.word.y], mul_lut[a.z | b.word.z], mul_lut[a.w | b.word.w]);
    let p = bitcast<vec4<i32>>(words << b.shift) >> vec4<u32>(16u);
    return (p.x + p.y) + (p.z + p.w);
}

fn dot4(a: u32, b: u32) -> i32 {
    let p0 = lut_product(a & 0xffu, b & 0xffu);
    let p1 = lut_product((a >> 8u) & 0xffu, (b >> 8u) & 0xffu);
    let p2 = lut_product((a >> 16u) & 0xffu, (b >> 16u) & 0xffu);
    let p3 = lut_product(a >> 24u, b >> 24u);
    return (p0 + p1) + (p2 + p3);
}
