//! Test support for tests/decoder.rs: weight sources (a deterministic synthetic checkpoint and a
//! memory-mapped safetensors file) and a plain f32 reference of one Whisper decoder step,
//! written from Hugging Face's `WhisperDecoder` semantics and independent of the MIL graph.

use anyhow::{anyhow, ensure, Context, Result};
use half::f16;
use milkit::ir::Bytes;
use milkit::whisper::decoder::DecoderDims;
use milkit::whisper::graph::WeightSource;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// A checkpoint held in memory, tensors by Hugging Face name.
pub struct MemWeights(pub HashMap<String, (Vec<usize>, Bytes)>);

impl WeightSource for MemWeights {
    fn f16(&self, name: &str) -> Result<(Vec<usize>, Bytes)> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| anyhow!("synthetic checkpoint has no tensor {name}"))
    }
}

/// Deterministic pseudo-random fp16 decoder weights with Hugging Face names: N(0, scale²)-ish
/// values from a 64-bit LCG; layer-norm gains near 1.
pub fn synthetic(d: &DecoderDims, seed: u64) -> MemWeights {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Sum of 4 uniforms: roughly normal, mean 0, variance 1/3.
        (0..4)
            .map(|i| ((state >> (16 * i)) & 0xffff) as f32 / 65535.0 - 0.5)
            .sum::<f32>()
            * 1.7
    };
    let mut m = HashMap::new();
    let mut put = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f16> = (0..n)
            .map(|_| f16::from_f32(offset + scale * next()))
            .collect();
        m.insert(name, (shape, Bytes::from_f16(&v)));
    };
    let (dm, f) = (d.d_model, d.ffn);
    let p = "model.decoder";
    put(
        format!("{p}.embed_tokens.weight"),
        vec![d.vocab, dm],
        0.5,
        0.0,
    );
    put(
        format!("{p}.embed_positions.weight"),
        vec![d.n_text_ctx, dm],
        0.2,
        0.0,
    );
    for l in 0..d.layers {
        let lp = format!("{p}.layers.{l}");
        let sd = 1.0 / (dm as f32).sqrt();
        for a in ["self_attn", "encoder_attn"] {
            for pr in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                put(format!("{lp}.{a}.{pr}.weight"), vec![dm, dm], sd, 0.0);
                if pr != "k_proj" {
                    put(format!("{lp}.{a}.{pr}.bias"), vec![dm], 0.1, 0.0);
                }
            }
        }
        for ln in [
            "self_attn_layer_norm",
            "encoder_attn_layer_norm",
            "final_layer_norm",
        ] {
            put(format!("{lp}.{ln}.weight"), vec![dm], 0.1, 1.0);
            put(format!("{lp}.{ln}.bias"), vec![dm], 0.1, 0.0);
        }
        put(format!("{lp}.fc1.weight"), vec![f, dm], sd, 0.0);
        put(format!("{lp}.fc1.bias"), vec![f], 0.1, 0.0);
        put(
            format!("{lp}.fc2.weight"),
            vec![dm, f],
            1.0 / (f as f32).sqrt(),
            0.0,
        );
        put(format!("{lp}.fc2.bias"), vec![dm], 0.1, 0.0);
    }
    put(format!("{p}.layer_norm.weight"), vec![dm], 0.1, 1.0);
    put(format!("{p}.layer_norm.bias"), vec![dm], 0.1, 0.0);
    MemWeights(m)
}

/// A memory-mapped safetensors checkpoint; tensors are zero-copy views of the map.
pub struct SafeWeights {
    map: Arc<memmap2::Mmap>,
    index: HashMap<String, (safetensors::Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

impl SafeWeights {
    pub fn open(path: &Path) -> Result<SafeWeights> {
        let f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: the fixture is read-only and not modified while mapped.
        let map = Arc::new(
            unsafe { memmap2::Mmap::map(&f) }
                .with_context(|| format!("cannot map {}", path.display()))?,
        );
        let st = safetensors::SafeTensors::deserialize(&map)
            .with_context(|| format!("{}: bad safetensors", path.display()))?;
        let base = map.as_ptr() as usize;
        let mut index = HashMap::new();
        for (name, view) in st.tensors() {
            let start = view.data().as_ptr() as usize - base;
            index.insert(
                name,
                (
                    view.dtype(),
                    view.shape().to_vec(),
                    start..start + view.data().len(),
                ),
            );
        }
        Ok(SafeWeights { map, index })
    }
    pub fn bytes(&self, name: &str) -> Result<(safetensors::Dtype, Vec<usize>, Bytes)> {
        let (dt, shape, r) = self
            .index
            .get(name)
            .ok_or_else(|| anyhow!("no tensor {name}"))?;
        Ok((
            *dt,
            shape.clone(),
            Bytes::from_mmap(self.map.clone(), r.clone())?,
        ))
    }
    pub fn f32s(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (dt, shape, b) = self.bytes(name)?;
        let v = match dt {
            safetensors::Dtype::F32 => b.to_f32_vec(),
            safetensors::Dtype::F16 => b.to_f16_vec().iter().map(|x| x.to_f32()).collect(),
            safetensors::Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            d => anyhow::bail!("{name}: unsupported dtype {d:?}"),
        };
        Ok((shape, v))
    }
}

impl WeightSource for SafeWeights {
    fn f16(&self, name: &str) -> Result<(Vec<usize>, Bytes)> {
        let (dt, shape, b) = self.bytes(name)?;
        ensure!(
            dt == safetensors::Dtype::F16,
            "{name} is {dt:?}, expected F16"
        );
        Ok((shape, b))
    }
}

fn f32s(w: &dyn WeightSource, name: &str) -> Result<Vec<f32>> {
    Ok(w.f16(name)?
        .1
        .to_f16_vec()
        .iter()
        .map(|x| x.to_f32())
        .collect())
}

struct Lin {
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    rows: usize,
    cols: usize,
}

impl Lin {
    fn load(w: &dyn WeightSource, name: &str, rows: usize, cols: usize, bias: bool) -> Result<Lin> {
        let b = if bias {
            Some(f32s(w, &format!("{name}.bias"))?)
        } else {
            None
        };
        Ok(Lin {
            w: f32s(w, &format!("{name}.weight"))?,
            b,
            rows,
            cols,
        })
    }
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        (0..self.rows)
            .map(|r| {
                let row = &self.w[r * self.cols..(r + 1) * self.cols];
                let s: f32 = row.iter().zip(x).map(|(a, b)| a * b).sum();
                s + self.b.as_ref().map_or(0.0, |b| b[r])
            })
            .collect()
    }
}

struct Norm(Vec<f32>, Vec<f32>);

impl Norm {
    fn load(w: &dyn WeightSource, name: &str) -> Result<Norm> {
        Ok(Norm(
            f32s(w, &format!("{name}.weight"))?,
            f32s(w, &format!("{name}.bias"))?,
        ))
    }
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = x.len() as f32;
        let mean = x.iter().sum::<f32>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let inv = 1.0 / (var + 1e-5).sqrt();
        x.iter()
            .enumerate()
            .map(|(i, v)| (v - mean) * inv * self.0[i] + self.1[i])
            .collect()
    }
}

struct Attn {
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
}

struct Layer {
    ln1: Norm,
    sa: Attn,
    ln2: Norm,
    ca: Attn,
    ln3: Norm,
    fc1: Lin,
    fc2: Lin,
}

/// erf in f64: its Taylor series for |x| < 3 (80 terms converge to ~1e-13 there), else the
/// continued fraction of erfc (fast for large |x|).
pub fn erf(x: f64) -> f64 {
    if x.abs() < 3.0 {
        let mut term = x;
        let mut sum = x;
        for n in 1..80 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        return sum * 2.0 / std::f64::consts::PI.sqrt();
    }
    let z = x.abs();
    let mut f = 0.0;
    for k in (1..60).rev() {
        f = (k as f64 / 2.0) / (z + f);
    }
    let erfc = (-z * z).exp() / std::f64::consts::PI.sqrt() / (z + f);
    if x > 0.0 {
        1.0 - erfc
    } else {
        erfc - 1.0
    }
}

pub fn gelu(x: f32) -> f32 {
    (0.5 * x as f64 * (1.0 + erf(x as f64 / std::f64::consts::SQRT_2))) as f32
}

/// The decoder in f32; cross keys/values and the self-attention cache per layer as
/// position-major rows of width d.
pub struct RefDecoder {
    d: DecoderDims,
    tokens: Vec<f32>,
    positions: Vec<f32>,
    layers: Vec<Layer>,
    ln: Norm,
    head: Vec<f32>,
}

/// Per-layer (keys, values), each `[positions][d]` flattened.
pub type Kv = Vec<(Vec<f32>, Vec<f32>)>;

/// What one step returns.
pub struct Step {
    pub logits: Vec<f32>,
    /// Per layer, this token's key and value (width d).
    pub k_new: Vec<Vec<f32>>,
    pub v_new: Vec<Vec<f32>>,
    /// Mean cross-attention weights over the requested (layer, head) pairs.
    pub alignment: Vec<f32>,
}

impl RefDecoder {
    pub fn load(d: &DecoderDims, w: &dyn WeightSource) -> Result<RefDecoder> {
        let p = "model.decoder";
        let dm = d.d_model;
        let attn = |a: &str| -> Result<Attn> {
            Ok(Attn {
                q: Lin::load(w, &format!("{a}.q_proj"), dm, dm, true)?,
                k: Lin::load(w, &format!("{a}.k_proj"), dm, dm, false)?,
                v: Lin::load(w, &format!("{a}.v_proj"), dm, dm, true)?,
                o: Lin::load(w, &format!("{a}.out_proj"), dm, dm, true)?,
            })
        };
        let mut layers = vec![];
        for l in 0..d.layers {
            let lp = format!("{p}.layers.{l}");
            layers.push(Layer {
                ln1: Norm::load(w, &format!("{lp}.self_attn_layer_norm"))?,
                sa: attn(&format!("{lp}.self_attn"))?,
                ln2: Norm::load(w, &format!("{lp}.encoder_attn_layer_norm"))?,
                ca: attn(&format!("{lp}.encoder_attn"))?,
                ln3: Norm::load(w, &format!("{lp}.final_layer_norm"))?,
                fc1: Lin::load(w, &format!("{lp}.fc1"), d.ffn, dm, true)?,
                fc2: Lin::load(w, &format!("{lp}.fc2"), dm, d.ffn, true)?,
            });
        }
        let tokens = f32s(w, &format!("{p}.embed_tokens.weight"))?;
        Ok(RefDecoder {
            d: d.clone(),
            head: tokens.clone(),
            tokens,
            positions: f32s(w, &format!("{p}.embed_positions.weight"))?,
            layers,
            ln: Norm::load(w, &format!("{p}.layer_norm"))?,
        })
    }

    /// Cross-attention keys/values of every layer for `enc` ([n_audio][d] flattened).
    pub fn cross_kv(&self, enc: &[f32]) -> Kv {
        let dm = self.d.d_model;
        self.layers
            .iter()
            .map(|l| {
                let (mut k, mut v) = (vec![], vec![]);
                for row in enc.chunks_exact(dm) {
                    k.extend(l.ca.k.apply(row));
                    v.extend(l.ca.v.apply(row));
                }
                (k, v)
            })
            .collect()
    }

    /// Softmax attention of one query over `keys`/`values` rows; returns the context and the
    /// per-head weights.
    fn attend(&self, q: &[f32], keys: &[f32], values: &[f32]) -> (Vec<f32>, Vec<Vec<f32>>) {
        let dm = self.d.d_model;
        let hd = dm / self.d.heads;
        let n = keys.len() / dm;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut ctx = vec![0.0; dm];
        let mut ws = vec![];
        for h in 0..self.d.heads {
            let r = h * hd..(h + 1) * hd;
            let s: Vec<f32> = (0..n)
                .map(|j| {
                    q[r.clone()]
                        .iter()
                        .zip(&keys[j * dm + r.start..j * dm + r.end])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            let w: Vec<f32> = e.iter().map(|x| x / z).collect();
            for (j, wj) in w.iter().enumerate() {
                for c in r.clone() {
                    ctx[c] += wj * values[j * dm + c];
                }
            }
            ws.push(w);
        }
        (ctx, ws)
    }

    /// One decoder step for `token` at position `pos`; `cache` holds the previous positions'
    /// self-attention keys/values and is extended with this token's.
    pub fn step(
        &self,
        token: usize,
        pos: usize,
        cross: &Kv,
        cache: &mut Kv,
        heads: &[(usize, usize)],
    ) -> Step {
        let dm = self.d.d_model;
        let mut h: Vec<f32> = (0..dm)
            .map(|c| self.tokens[token * dm + c] + self.positions[pos * dm + c])
            .collect();
        let (mut k_new, mut v_new) = (vec![], vec![]);
        let mut alignment = vec![0.0; self.d.n_audio_ctx];
        for (li, l) in self.layers.iter().enumerate() {
            let x = l.ln1.apply(&h);
            let (q, k, v) = (l.sa.q.apply(&x), l.sa.k.apply(&x), l.sa.v.apply(&x));
            cache[li].0.extend(&k);
            cache[li].1.extend(&v);
            k_new.push(k);
            v_new.push(v);
            let (ctx, _) = self.attend(&q, &cache[li].0, &cache[li].1);
            h.iter_mut()
                .zip(l.sa.o.apply(&ctx))
                .for_each(|(a, b)| *a += b);
            let x = l.ln2.apply(&h);
            let (ctx, ws) = self.attend(&l.ca.q.apply(&x), &cross[li].0, &cross[li].1);
            for &(al, ah) in heads {
                if al == li {
                    alignment
                        .iter_mut()
                        .zip(&ws[ah])
                        .for_each(|(a, b)| *a += b / heads.len() as f32);
                }
            }
            h.iter_mut()
                .zip(l.ca.o.apply(&ctx))
                .for_each(|(a, b)| *a += b);
            let x = l.ln3.apply(&h);
            let f: Vec<f32> = l.fc1.apply(&x).into_iter().map(gelu).collect();
            h.iter_mut().zip(l.fc2.apply(&f)).for_each(|(a, b)| *a += b);
        }
        let x = self.ln.apply(&h);
        let logits = self
            .head
            .chunks_exact(dm)
            .map(|row| row.iter().zip(&x).map(|(a, b)| a * b).sum())
            .collect();
        Step {
            logits,
            k_new,
            v_new,
            alignment,
        }
    }
}

/// PSNR as whisperkittools computes it: 20·log10(max|ref| / RMSE).
pub fn psnr(reference: &[f32], test: &[f32]) -> f64 {
    assert_eq!(reference.len(), test.len(), "psnr of different lengths");
    let peak = reference.iter().fold(0f64, |m, x| m.max(x.abs() as f64));
    let mse = reference
        .iter()
        .zip(test)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum::<f64>()
        / reference.len() as f64;
    20.0 * ((peak + 1e-10) / (mse.sqrt() + 1e-10)).log10()
}
