#!/usr/bin/env python3
"""An independent implementation of the verified INT8 units, written from docs/VERIFICATION.md.

Pure Python, no third-party packages. With `--probe` it builds the probe GEMM from the
documented generator and prints its hash. Otherwise it reads a JSON list of cases
({"name", "m", "n", "k", "a": [u32 bits], "b": [u32 bits]}) on stdin and prints a JSON list of
output bit lists, one per case. It also prints nothing else, so a driver can parse stdout.
"""
import json
import struct
import sys

BLOCK = 32
F32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]


def f32_from_bits(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def bits_from_f32(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


def round_to_f32(x):
    """Round a Python float (binary64) to binary32, nearest-even; overflow gives ±inf."""
    if x != x or x in (float("inf"), float("-inf")):
        return x
    # Values at or beyond MAX + half an ulp overflow under round-to-nearest.
    limit = F32_MAX + 2.0 ** 103
    if abs(x) >= limit:
        return float("inf") if x > 0 else float("-inf")
    return struct.unpack("<f", struct.pack("<f", x))[0]


def block_exponent(amax_bits):
    biased = amax_bits >> 23
    if biased == 0:
        return 0
    mantissa = (amax_bits & 0x7FFFFF) | 0x800000
    e = biased - 133
    if mantissa > 127 * 2 ** 17:
        e += 1
    return e


def quantize(bits, e):
    biased = (bits >> 23) & 0xFF
    if biased == 0:
        return 0
    mantissa = (bits & 0x7FFFFF) | 0x800000
    s = 150 + e - biased
    assert s >= 17
    if s > 24:
        magnitude = 0
    else:
        t = mantissa >> s
        r = mantissa % (1 << s)
        h = 1 << (s - 1)
        magnitude = t + 1 if (r > h or (r == h and t % 2 == 1)) else t
    return -magnitude if bits >> 31 else magnitude


def quantize_rows(bits, rows, k):
    blocks = (k + BLOCK - 1) // BLOCK
    out = []
    for row in range(rows):
        row_blocks = []
        for b in range(blocks):
            chunk = bits[row * k + b * BLOCK: row * k + min(k, (b + 1) * BLOCK)]
            amax = max(x & 0x7FFFFFFF for x in chunk)
            e = block_exponent(amax)
            q = [quantize(x, e) for x in chunk]
            row_blocks.append((q, e))
        out.append(row_blocks)
    return out


def term(acc, s):
    if acc == 0:
        return 0.0
    t = struct.unpack("<I", struct.pack("<f", float(acc)))[0]
    biased = ((t >> 23) & 0xFF) + s
    if biased <= 0:
        return 0.0
    if biased >= 255:
        return float("-inf") if acc < 0 else float("inf")
    return f32_from_bits((t & ~0x7F800000 & 0xFFFFFFFF) | (biased << 23))


def flush(x):
    if x == x and abs(x) < 2.0 ** -126:
        return 0.0
    return x


def unit(m, n, k, a_bits, b_bits):
    for bits in (a_bits, b_bits):
        for x in bits:
            if x & 0x7F800000 == 0x7F800000:
                raise ValueError("non-finite input")
    qa = quantize_rows(a_bits, m, k)
    qb = quantize_rows(b_bits, n, k)
    out = []
    for i in range(m):
        for j in range(n):
            total = 0.0
            for (xa, ea), (xb, eb) in zip(qa[i], qb[j]):
                acc = sum(p * q for p, q in zip(xa, xb))
                t = term(acc, ea + eb)
                if total != total or t != t:
                    total = float("nan")
                elif total in (float("inf"), float("-inf")) and t == -total:
                    total = float("nan")
                else:
                    total = flush(round_to_f32(total + t))
            out.append(0x7FC00000 if total != total else bits_from_f32(total))
    return out


class SplitMix64:
    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) % 2 ** 64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2 ** 64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2 ** 64
        return z ^ (z >> 31)

    def below(self, bound):
        return (self.next() * bound) >> 64

    def signed_unit(self):
        return ((self.next() >> 40) - 2 ** 23) / 2 ** 23


def probe_hash():
    m, n, k = 37, 53, 200
    rng = SplitMix64(0x6C6F636B73746570)

    def draw(rows):
        values = []
        for _ in range(rows):
            scale = 2.0 ** (rng.below(16) - 8)
            values.extend(bits_from_f32(rng.signed_unit() * scale) for _ in range(k))
        return values

    a = draw(m)
    b = draw(n)
    h = 0x811C9DC5
    for bits in unit(m, n, k, a, b):
        for byte in struct.pack("<I", bits):
            h = ((h ^ byte) * 0x01000193) % 2 ** 32
    return h


def main():
    if sys.argv[1:] == ["--probe"]:
        print(f"{probe_hash():#010x}")
        return
    cases = json.load(sys.stdin)
    json.dump([unit(c["m"], c["n"], c["k"], c["a"], c["b"]) for c in cases], sys.stdout)


if __name__ == "__main__":
    main()
