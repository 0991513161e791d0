// The exact int8 product of four packed pairs through the hardware dot product (DP4A).
// `dot4I8Packed` sign-extends each byte and sums the four products in i32: exact for every i8.
requires packed_4x8_integer_dot_product;

fn dot4(a: u32, b: u32) -> i32 {
    return dot4I8Packed(a, b);
}
