"use strict";
// The lockstep inference kit: the model's forward pass in JavaScript, through the same
// verified INT8 units (docs/VERIFICATION.md) and the same element-wise f32 math
// (luts/src/mathf.rs), so greedy generation here yields exactly the tokens
// `lockstep generate` yields. Every f32 operation is followed by Math.fround: binary64 has
// enough precision that this is the correctly rounded binary32 result, as in Rust.
// Each function below mirrors a named Rust function line by line, in the same order.

const f = Math.fround;
const scratch = new DataView(new ArrayBuffer(4));
function fromBits(bits) { scratch.setUint32(0, bits >>> 0, true); return scratch.getFloat32(0, true); }
function bitsOf(x) { scratch.setFloat32(0, x, true); return scratch.getUint32(0, true); }

// ---- mathf.rs: constants by their bits ----
const LOG2_E = fromBits(0x3fb8aa3b), LN2_HI = fromBits(0x3f317200), LN2_LO = fromBits(0x35bfbe8e);
const INV_FACT = [0x39500d01, 0x3ab60b61, 0x3c088889, 0x3d2aaaab, 0x3e2aaaab].map(fromBits);
const ROUND_MAGIC = fromBits(0x4b400000), EXP_LO = fromBits(0xc2aea8f6), EXP_HI = fromBits(0x42b170a4);
const GELU_C = fromBits(0x3f4c422a), GELU_A = fromBits(0x3d372713), LN_EPS = fromBits(0x3727c5ac);
const MIN_NORMAL = fromBits(0x00800000);

function pow2(n) { return fromBits((127 + n) << 23); }
function clamp(x, lo, hi) { return x < lo ? lo : (x > hi ? hi : x); }

function exp(x) {
  x = clamp(x, EXP_LO, EXP_HI);
  const n = f(f(f(x * LOG2_E) + ROUND_MAGIC) - ROUND_MAGIC);
  const r = f(f(x - f(n * LN2_HI)) - f(n * LN2_LO));
  let p = INV_FACT[0];
  p = f(f(p * r) + INV_FACT[1]);
  p = f(f(p * r) + INV_FACT[2]);
  p = f(f(p * r) + INV_FACT[3]);
  p = f(f(p * r) + INV_FACT[4]);
  p = f(f(p * r) + 0.5);
  p = f(f(p * r) + 1);
  p = f(f(p * r) + 1);
  const ni = n | 0;
  const half = ni >> 1;
  return f(f(p * pow2(half)) * pow2(ni - half));
}

function tanh(x) {
  x = clamp(x, -9, 9);
  const e = exp(f(2 * x));
  return f(f(e - 1) / f(e + 1));
}

function gelu(x) {
  const inner = f(GELU_C * f(x + f(GELU_A * f(f(x * x) * x))));
  return f(f(0.5 * x) * f(1 + tanh(inner)));
}

// ---- luts/src/units.rs: the reference units ----
const BLOCK = 32;

function blockExponent(amaxBits) {
  const biased = amaxBits >>> 23;
  if (biased === 0) return 0;
  const mantissa = (amaxBits & 0x7fffff) | 0x800000;
  const e = biased - 133;
  return mantissa > 127 * 131072 ? e + 1 : e;
}

function quantizeValue(bits, e) {
  const biased = (bits >>> 23) & 0xff;
  if (biased === 0) return 0;
  const mantissa = (bits & 0x7fffff) | 0x800000;
  const shift = 150 + e - biased;
  let magnitude;
  if (shift > 24) {
    magnitude = 0;
  } else {
    const truncated = mantissa >>> shift;
    const remainder = mantissa & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    magnitude = (remainder > half || (remainder === half && (truncated & 1) === 1)) ? truncated + 1 : truncated;
  }
  return (bits >>> 31) ? -magnitude : magnitude;
}

// Quantizes a rows × k matrix (Float32Array) along k.
function quantizeRows(values, rows, k) {
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const blocks = Math.ceil(k / BLOCK);
  const q = new Int8Array(rows * blocks * BLOCK);
  const exps = new Int32Array(rows * blocks);
  for (let row = 0; row < rows; row++) {
    for (let block = 0; block < blocks; block++) {
      const start = row * k + block * BLOCK;
      const end = Math.min(start + BLOCK, row * k + k);
      let amax = 0;
      for (let i = start; i < end; i++) {
        const b = bits[i];
        if ((b & 0x7f800000) === 0x7f800000) throw new Error("non-finite input to the units");
        const m = b & 0x7fffffff;
        if (m > amax) amax = m;
      }
      const e = blockExponent(amax);
      exps[row * blocks + block] = e;
      const out = (row * blocks + block) * BLOCK;
      for (let i = start; i < end; i++) q[out + i - start] = quantizeValue(bits[i], e);
    }
  }
  return { q, exps, blocks };
}

function blockTerm(acc, scaleExp) {
  if (acc === 0) return 0;
  const bits = bitsOf(acc);
  const biased = ((bits >>> 23) & 0xff) + scaleExp;
  if (biased <= 0) return 0;
  if (biased >= 255) return acc < 0 ? -Infinity : Infinity;
  return fromBits((bits & 0x807fffff) | (biased << 23));
}

// C (m × n) = A · Bᵀ from quantized rows of A (m of them) and of B (n of them).
function gemmQuantized(qa, qb, m, n) {
  const out = new Float32Array(m * n);
  const blocks = qa.blocks;
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let sum = 0;
      for (let block = 0; block < blocks; block++) {
        const ao = (i * blocks + block) * BLOCK, bo = (j * blocks + block) * BLOCK;
        let acc = 0;
        for (let t = 0; t < BLOCK; t++) acc += qa.q[ao + t] * qb.q[bo + t];
        sum = f(sum + blockTerm(acc, qa.exps[i * blocks + block] + qb.exps[j * blocks + block]));
        if (Math.abs(sum) < MIN_NORMAL) sum = 0;
      }
      out[i * n + j] = sum;
    }
  }
  return out;
}

function gemm(a, m, b, n, k) {
  return gemmQuantized(quantizeRows(a, m, k), quantizeRows(b, n, k), m, n);
}

// ---- node/src/model.rs: the forward pass for one sequence ----
function makeModel(config, weights) {
  const c = config.width, t = config.context, heads = config.heads, hd = c / heads, vocab = 256;
  let at = 0;
  const take = (len) => { const v = weights.subarray(at, at + len); at += len; return v; };
  // A weight matrix [out, in] with its quantized rows, computed once.
  const matrix = (out, inp) => { const w = take(out * inp); return { w, q: quantizeRows(w, out, inp), out, inp }; };
  const model = { tokEmb: take(vocab * c), posEmb: take(t * c), layers: [] };
  for (let l = 0; l < config.layers; l++) {
    model.layers.push({
      ln1g: take(c), ln1b: take(c), qkv: matrix(3 * c, c), qkvb: take(3 * c), proj: matrix(c, c), projb: take(c),
      ln2g: take(c), ln2b: take(c), fc: matrix(4 * c, c), fcb: take(4 * c), fc2: matrix(c, 4 * c), fc2b: take(c),
    });
  }
  model.lnfg = take(c); model.lnfb = take(c); model.head = matrix(vocab, c); model.headb = take(vocab);
  if (at !== weights.length) throw new Error(`weights hold ${weights.length} values, the model needs ${at}`);

  function linear(x, n, m, bias) {
    const y = gemmQuantized(quantizeRows(x, n, m.inp), m.q, n, m.out);
    for (let r = 0; r < n; r++) for (let j = 0; j < m.out; j++) y[r * m.out + j] = f(y[r * m.out + j] + bias[j]);
    return y;
  }

  // A lane sum (docs/VERIFICATION.md §9): value i goes to lane i mod 32, each lane adds from +0
  // in index order, then the lanes are added in lane order.
  function laneSum(n, value) {
    const lanes = new Float64Array(32);
    for (let i = 0; i < n; i++) lanes[i % 32] = f(lanes[i % 32] + value(i));
    let sum = lanes[0];
    for (let l = 1; l < 32; l++) sum = f(sum + lanes[l]);
    return sum;
  }

  function layerNorm(x, rows, g, b) {
    const y = new Float32Array(x.length);
    for (let r = 0; r < rows; r++) {
      const mean = f(laneSum(c, (j) => x[r * c + j]) / c);
      const v = laneSum(c, (j) => { const d = f(x[r * c + j] - mean); return f(d * d); });
      const rstd = f(1 / f(Math.sqrt(f(f(v / c) + LN_EPS))));
      for (let j = 0; j < c; j++) {
        const h = f(f(x[r * c + j] - mean) * rstd);
        y[r * c + j] = f(f(h * g[j]) + b[j]);
      }
    }
    return y;
  }

  function causalSoftmax(s, n, scale) {
    for (let i = 0; i < n; i++) {
      let max = -Infinity;
      for (let j = 0; j <= i; j++) { s[i * n + j] = f(s[i * n + j] * scale); max = Math.max(max, s[i * n + j]); }
      for (let j = 0; j <= i; j++) s[i * n + j] = exp(f(s[i * n + j] - max));
      const sum = laneSum(i + 1, (j) => s[i * n + j]);
      for (let j = 0; j <= i; j++) s[i * n + j] = f(s[i * n + j] / sum);
      for (let j = i + 1; j < n; j++) s[i * n + j] = 0;
    }
  }

  // Logits of the last position for `tokens` (length ≤ context).
  function lastLogits(tokens) {
    const n = tokens.length;
    let x = new Float32Array(n * c);
    for (let row = 0; row < n; row++) {
      for (let j = 0; j < c; j++) x[row * c + j] = f(model.tokEmb[tokens[row] * c + j] + model.posEmb[row * c + j]);
    }
    const scale = f(1 / f(Math.sqrt(hd)));
    for (const L of model.layers) {
      const h1 = layerNorm(x, n, L.ln1g, L.ln1b);
      const qkv = linear(h1, n, L.qkv, L.qkvb);
      const att = new Float32Array(n * c);
      const q = new Float32Array(n * hd), k = new Float32Array(n * hd), vt = new Float32Array(hd * n);
      for (let h = 0; h < heads; h++) {
        for (let i = 0; i < n; i++) {
          for (let d = 0; d < hd; d++) {
            q[i * hd + d] = qkv[i * 3 * c + h * hd + d];
            k[i * hd + d] = qkv[i * 3 * c + c + h * hd + d];
            vt[d * n + i] = qkv[i * 3 * c + 2 * c + h * hd + d];
          }
        }
        const p = gemm(q, n, k, n, hd);
        causalSoftmax(p, n, scale);
        const o = gemm(p, n, vt, hd, n);
        for (let i = 0; i < n; i++) for (let d = 0; d < hd; d++) att[i * c + h * hd + d] = o[i * hd + d];
      }
      const proj = linear(att, n, L.proj, L.projb);
      for (let i = 0; i < x.length; i++) x[i] = f(x[i] + proj[i]);
      const h2 = layerNorm(x, n, L.ln2g, L.ln2b);
      const u = linear(h2, n, L.fc, L.fcb);
      const g = new Float32Array(u.length);
      for (let i = 0; i < u.length; i++) g[i] = gelu(u[i]);
      const m = linear(g, n, L.fc2, L.fc2b);
      for (let i = 0; i < x.length; i++) x[i] = f(x[i] + m[i]);
    }
    const hf = layerNorm(x, n, model.lnfg, model.lnfb);
    // Only the last row's logits are needed, and rows are independent in every step above
    // except attention, which is done: run the head on the last row alone.
    const last = hf.subarray((n - 1) * c, n * c).slice();
    return linear(last, 1, model.head, model.headb);
  }

  return { lastLogits, context: t };
}

function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

function decodeWeights(base64) {
  const raw = atob(base64);
  const view = new DataView(new ArrayBuffer(raw.length));
  for (let i = 0; i < raw.length; i++) view.setUint8(i, raw.charCodeAt(i));
  const out = new Float32Array(raw.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

function hex(bytes) { return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(""); }

window.addEventListener("DOMContentLoaded", () => {
  const config = JSON.parse(document.getElementById("config").textContent);
  const status = document.getElementById("status");
  const output = document.getElementById("output");
  const button = document.getElementById("generate");
  let model;
  try {
    model = makeModel(config, decodeWeights(document.getElementById("weights").textContent.trim()));
    // For tests and the curious: the last position's logits, as f32 bit patterns in hex.
    window.lockstepKit = {
      lastLogitsHex: (tokens) => Array.from(model.lastLogits(tokens), (v) => bitsOf(v).toString(16).padStart(8, "0")).join(""),
    };
    status.textContent = `ready: ${config.parameters} parameters, step ${config.step}`;
  } catch (e) {
    status.textContent = "error: " + e.message;
    return;
  }
  button.addEventListener("click", () => {
    const prompt = new TextEncoder().encode(document.getElementById("prompt").value);
    const count = Math.max(1, Math.min(2000, parseInt(document.getElementById("tokens").value, 10) || 1));
    const tokens = prompt.length ? Array.from(prompt) : [10];
    const generated = [];
    button.disabled = true;
    output.textContent = "";
    output.dataset.bytes = "";
    status.textContent = "generating…";
    const stepOnce = () => {
      const window_ = tokens.slice(Math.max(0, tokens.length - model.context));
      const next = argmax(model.lastLogits(window_));
      tokens.push(next);
      generated.push(next);
      output.textContent = new TextDecoder().decode(new Uint8Array(generated));
      if (generated.length < count) {
        setTimeout(stepOnce, 0);
      } else {
        output.dataset.bytes = hex(generated);
        status.textContent = "done";
        button.disabled = false;
      }
    };
    setTimeout(stepOnce, 0);
  });
});
