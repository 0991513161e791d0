// The exact int8 product of four packed pairs through the hardware dot product (DP4A).
// `dot4I8Packed` sign-extends each byte and sums the four products in i32: exact for every i8.
// The unit kernels prepare each operand word once (`prepare_a`, `prepare_b`) and multiply the
// prepared words (`dot4_prepared`); for DP4A the preparation is the word itself.
requires packed_4x8_integer_dot_product;

alias PreparedA = u32;
alias PreparedB = u32;

fn prepare_a(a: u32) -> PreparedA {
    return a;
}

fn prepare_b(b: u32) -> PreparedB {
    return b;
}

fn dot4_prepared(a: PreparedA, b: PreparedB) -> i32 {
    return dot4I8Packed(a, b);
}

fn dot4(a: u32, b: u32) -> i32 {
    return dot4I8Packed(a, b);
}
