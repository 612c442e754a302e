//! Drives a WhisperKit-ABI `TextDecoder` package one token at a time: host-side self-attention
//! caches (`key_cache`/`value_cache` in, `*_cache_updates` out) or Core ML states, cross
//! attention from `encoder_output_embeds` or from precomputed `encoder_attn_*_cache` inputs.
//! The variant is read from the package's description, never from its file name.

use crate::ir::{Dim, ValueType};
use crate::kernels;
use crate::runtime::{Session, Tensor};
use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::Device;
use half::f16;
use std::path::Path;

/// The additive padding-mask value of hidden cache positions (WhisperKit's).
const MASK_HIDDEN: f32 = -1e4;

/// WhisperKit's name of the alignment heads' mean cross-attention output.
pub const ALIGNMENT_OUTPUT: &str = "alignment_heads_weights";
pub use crate::whisper::decoder::PER_HEAD_ALIGNMENT_OUTPUT;

/// Where the self-attention caches live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    /// `key_cache`/`value_cache` are inputs; the decoder returns the new column.
    Io,
    /// `key_cache`/`value_cache` are Core ML states updated in-graph.
    State,
}

/// The cross-attention source the decoder takes once per window.
#[derive(Clone, Debug)]
pub enum Cross {
    /// `encoder_output_embeds` [1, d, 1, n_audio].
    Encoder(Tensor),
    /// `encoder_attn_key_cache`/`encoder_attn_value_cache` [1, d·layers, 1, n_audio].
    Precomputed { key: Tensor, value: Tensor },
}

/// Receives, after every step, the outputs the decoder does not use itself (the extra
/// outputs of an instrumented program, e.g. calibration probes).
pub type StepObserver = Box<dyn FnMut(Vec<(String, Tensor)>) -> Result<()> + Send>;

/// One host-side self-attention cache, [1, channels, 1, positions], at the precision of
/// the decoder's cache input (fp16 for every package; fp32 when the session widens it).
/// Each step writes only this token's column into it, in place, and feeds it as a new
/// tensor sharing its storage (a new id, so the session's memo sees a new input), instead
/// of copying the whole cache — megabytes per token at real sizes — into a fresh tensor.
/// Nothing else keeps a tensor on this storage past a call but the session's memo, which
/// drops whatever depends on the cache when the next call hands in a changed one.
#[derive(Clone, Debug)]
struct HostCache(Tensor);

impl HostCache {
    fn zeros(shape: &[usize], wide: bool) -> Result<HostCache> {
        let dt = if wide {
            candle_core::DType::F32
        } else {
            candle_core::DType::F16
        };
        Ok(HostCache(Tensor::zeros(shape, dt, &Device::Cpu)?))
    }

    /// Zeros in fresh storage (a tensor handed out before keeps its values).
    fn clear(&mut self) -> Result<()> {
        *self = HostCache(self.0.zeros_like()?);
        Ok(())
    }

    /// A cache of no positions, left in the decoder while its cache is taken out.
    fn placeholder(&self) -> Result<HostCache> {
        Ok(HostCache(Tensor::zeros(
            &[1, 0, 1, 0],
            self.0.dtype(),
            &Device::Cpu,
        )?))
    }

    /// A copy in its own storage (steps write into a cache in place).
    fn fork(&self) -> Result<HostCache> {
        Ok(HostCache(self.0.force_contiguous()?))
    }

    fn tensor(&self) -> Result<Tensor> {
        Ok(self.0.reshape(self.0.dims())?)
    }

    /// Writes positions `at` of a [1, c, 1, n] block (a prefill's output) into the same
    /// positions of the cache.
    fn set_columns(&mut self, name: &str, t: &Tensor, at: std::ops::Range<usize>) -> Result<()> {
        let (c, n) = (self.0.dims()[1], t.dims().last().copied().unwrap_or(0));
        ensure!(
            t.dims() == [1, c, 1, n] && at.end <= n,
            "`{name}` has shape {:?}, expected [1, {c}, 1, at least {}]",
            t.dims(),
            at.end
        );
        let cols = t
            .narrow(3, at.start, at.len())?
            .to_dtype(self.0.dtype())?
            .contiguous()?;
        self.0.slice_set(&cols, 3, at.start)?;
        Ok(())
    }

    /// Writes a `*_cache_updates` output (`c` channels) into position `pos`.
    fn set_column(&mut self, name: &str, t: &Tensor, c: usize, pos: usize) -> Result<()> {
        ensure!(
            t.elem_count() == c,
            "`{name}` has {} values, expected {c}",
            t.elem_count()
        );
        let col = t
            .to_dtype(self.0.dtype())?
            .reshape(&[1, c, 1, 1])?
            .contiguous()?;
        self.0.slice_set(&col, 3, pos)?;
        Ok(())
    }
}

/// A window's self-attention cache taken out of a [`TextDecoder`] ([`TextDecoder::take_cache`]),
/// for decoding several sequences (beams, samples) with one batch-1 decoder.
#[derive(Debug)]
pub struct DecoderCache(CacheData);

#[derive(Debug)]
enum CacheData {
    /// A cache-I/O decoder's host caches.
    Host { key: HostCache, value: HostCache },
    /// A stateful decoder's states, by name. The session copies a state it was handed
    /// before its first in-place write, so a clone of these values is an independent fork.
    State(Vec<(String, Tensor)>),
}

impl DecoderCache {
    /// An independent copy: later steps on either never change the other. Host caches are
    /// copied (steps write into them in place); state values are shared until the session
    /// writes into one, which it copies first.
    pub fn fork(&self) -> Result<DecoderCache> {
        Ok(DecoderCache(match &self.0 {
            CacheData::Host { key, value } => CacheData::Host {
                key: key.fork()?,
                value: value.fork()?,
            },
            CacheData::State(states) => CacheData::State(states.clone()),
        }))
    }
}

/// The caches of the sequences a search decodes at once (see
/// [`crate::whisper::generate::Sequences`]): the sequence stepped last keeps its cache in the
/// decoder, the others are parked here. One sequence, in the decoder, to begin with; steps
/// of the same sequence in a row move no cache.
#[derive(Debug)]
pub struct SequenceCaches {
    parked: Vec<Option<DecoderCache>>,
    /// The sequence whose cache is in the decoder (its slot in `parked` is empty).
    active: Option<usize>,
}

impl Default for SequenceCaches {
    fn default() -> Self {
        SequenceCaches {
            parked: vec![None],
            active: Some(0),
        }
    }
}

impl SequenceCaches {
    /// Puts sequence `seq`'s cache into `decoder` (parking the one there).
    pub fn select(&mut self, decoder: &mut TextDecoder, seq: usize) -> Result<()> {
        ensure!(
            seq < self.parked.len(),
            "sequence {seq} of {} decoded",
            self.parked.len()
        );
        if self.active == Some(seq) {
            return Ok(());
        }
        if let Some(a) = self.active.take() {
            self.parked[a] = Some(decoder.take_cache()?);
        }
        let cache = self.parked[seq]
            .take()
            .ok_or_else(|| anyhow!("sequence {seq} has no cache"))?;
        decoder.put_cache(cache)?;
        self.active = Some(seq);
        Ok(())
    }

    /// New sequence `i` continues old sequence `sources[i]`: each source's cache moves to
    /// its first new sequence, and is copied ([`DecoderCache::fork`]) only for the others.
    pub fn reorder(&mut self, decoder: &mut TextDecoder, sources: &[usize]) -> Result<()> {
        let n = self.parked.len();
        if let Some(&s) = sources.iter().find(|&&s| s >= n) {
            bail!("sequence {s} of {n} cannot be continued");
        }
        if let Some(a) = self.active.take() {
            self.parked[a] = Some(decoder.take_cache()?);
        }
        let mut first: Vec<Option<usize>> = vec![None; n];
        let mut next: Vec<Option<DecoderCache>> = Vec::with_capacity(sources.len());
        for (i, &s) in sources.iter().enumerate() {
            next.push(match first[s] {
                None => {
                    first[s] = Some(i);
                    self.parked[s].take()
                }
                Some(_) => None,
            });
        }
        for (i, &s) in sources.iter().enumerate() {
            if next[i].is_none() {
                let k = first[s].ok_or_else(|| anyhow!("source {s} was not moved"))?;
                let copy = next[k]
                    .as_ref()
                    .ok_or_else(|| anyhow!("sequence {s} has no cache"))?
                    .fork()?;
                next[i] = Some(copy);
            }
        }
        self.parked = next;
        Ok(())
    }
}

/// Loads a package or compiled model computing at `compute` precision (otherwise the
/// runtime's default options).
pub(crate) fn load_session(
    path: &Path,
    compute: crate::runtime::precision::Compute,
) -> Result<Session> {
    let opts = crate::runtime::Options {
        compute,
        ..Default::default()
    };
    Session::load_with(path, &opts)
}

/// WhisperKit's `TextDecoderContextPrefill`: `task` (0 transcribe, 1 translate) and
/// `language` (a language token id) → `key_cache_prefill`/`value_cache_prefill`
/// [1, d·layers, 1, 3], the self-attention caches of `<|startoftranscript|> <|lang|>
/// <|task|>` at positions 0–2, estimated without the audio (milkit's from a zero encoder
/// output, argmax's from a mean over random ones).
pub struct Prefill {
    session: Session,
    channels: usize,
    positions: usize,
}

impl Prefill {
    /// Loads `path` and checks its inputs and outputs against the ABI above.
    pub fn load_with(path: &Path, compute: crate::runtime::precision::Compute) -> Result<Prefill> {
        Prefill::new(load_session(path, compute)?)
            .with_context(|| format!("{}: not a usable context prefill", path.display()))
    }

    pub fn new(session: Session) -> Result<Prefill> {
        let ins = session.inputs(None)?;
        for need in ["task", "language"] {
            let (n, ty) = ins
                .iter()
                .find(|(n, _)| n == need)
                .ok_or_else(|| anyhow!("it lacks the input `{need}`"))?;
            ensure!(
                fixed_shape(n, ty)?.iter().product::<usize>() == 1,
                "input `{n}` is {ty}, expected one int32"
            );
        }
        ensure!(
            ins.len() == 2,
            "it takes {} inputs, expected task and language",
            ins.len()
        );
        let outs = session.outputs(None)?;
        let mut shapes = vec![];
        for need in ["key_cache_prefill", "value_cache_prefill"] {
            let (n, ty) = outs
                .iter()
                .find(|(n, _)| n == need)
                .ok_or_else(|| anyhow!("it lacks the output `{need}`"))?;
            let s = fixed_shape(n, ty)?;
            ensure!(
                s.len() == 4 && s[0] == 1 && s[2] == 1,
                "`{n}` has shape {s:?}, expected [1, d_model·layers, 1, positions]"
            );
            shapes.push(s);
        }
        ensure!(
            shapes[0] == shapes[1],
            "key_cache_prefill {:?} and value_cache_prefill {:?} differ",
            shapes[0],
            shapes[1]
        );
        Ok(Prefill {
            session,
            channels: shapes[0][1],
            positions: shapes[0][3],
        })
    }

    /// Cache positions it fills (3).
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Cache channels (d_model · layers).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// The key and value caches of the prefix of `task` (0/1) and `language` (token id).
    pub fn caches(&mut self, task: u32, language: u32) -> Result<(Tensor, Tensor)> {
        let one = |v: u32| -> Result<Tensor> {
            let v = i32::try_from(v).context("token id out of range")?;
            Ok(Tensor::from_vec(vec![v], 1, &Device::Cpu)?)
        };
        let out = self
            .session
            .predict(&[("task", one(task)?), ("language", one(language)?)])
            .context("context prefill")?;
        let get = |name: &str| -> Result<Tensor> {
            let i = out
                .iter()
                .position(|(n, _)| n == name)
                .ok_or_else(|| anyhow!("the context prefill returned no `{name}`"))?;
            Ok(out[i].1.clone())
        };
        Ok((get("key_cache_prefill")?, get("value_cache_prefill")?))
    }
}

/// A loaded text decoder and its cache for the current window.
pub struct TextDecoder {
    session: Session,
    kind: CacheKind,
    precomputed_cross: bool,
    /// Input names in the order the function lists them.
    inputs: Vec<String>,
    /// Cache channels (d_model · layers) and positions (448).
    channels: usize,
    positions: usize,
    vocab: usize,
    key: HostCache,
    value: HostCache,
    cross: Option<Cross>,
    observer: Option<StepObserver>,
    /// Whether the cache was taken out ([`Self::take_cache`]) and not put back.
    cache_out: bool,
    /// Whether `alignment_heads_weights` rows are kept (for word timestamps).
    capture_alignment: bool,
    /// The alignment row(s) of the last step, when captured.
    alignment: Option<Vec<f32>>,
    /// The output alignment rows come from: the per-head output when the package has it
    /// (milkit's by default with `export --component all`), else WhisperKit's mean; with how many heads per
    /// row (1 for the mean). None when the package has neither.
    alignment_source: Option<(&'static str, usize)>,
}

fn fixed_shape(name: &str, ty: &ValueType) -> Result<Vec<usize>> {
    let t = ty
        .as_tensor()
        .ok_or_else(|| anyhow!("`{name}` is not a tensor"))?;
    t.shape
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => Ok(*n),
            _ => bail!("`{name}` has a flexible shape ({t}); the decoder ABI fixes it"),
        })
        .collect()
}

impl TextDecoder {
    /// Loads `path` and checks that it speaks the WhisperKit TextDecoder ABI.
    pub fn load(path: &Path) -> Result<TextDecoder> {
        TextDecoder::load_with(path, crate::runtime::precision::Compute::Package)
    }

    /// [`Self::load`], computing at `compute` precision. Host-side caches follow the
    /// package's declared cache type (fp16 caches stay fp16 unless `compute` widens them).
    pub fn load_with(
        path: &Path,
        compute: crate::runtime::precision::Compute,
    ) -> Result<TextDecoder> {
        TextDecoder::new(load_session(path, compute)?)
            .with_context(|| format!("{}: not a usable text decoder", path.display()))
    }

    pub fn new(session: Session) -> Result<TextDecoder> {
        let ins = session.inputs(None)?;
        let outs = session.outputs(None)?;
        let states = &session.description().states;
        let has_state = states.iter().any(|s| s.name == "key_cache");
        let cache_in = ins.iter().find(|(n, _)| n == "key_cache");
        let (kind, cache_shape) = match (cache_in, has_state) {
            (Some((n, ty)), _) => (CacheKind::Io, fixed_shape(n, ty)?),
            (None, true) => {
                let f = states
                    .iter()
                    .find(|s| s.name == "key_cache")
                    .ok_or_else(|| anyhow!("state key_cache vanished"))?;
                (CacheKind::State, f.shape.clone())
            }
            (None, false) => bail!(
                "it has neither a `key_cache` input nor a `key_cache` state (inputs: {})",
                ins.iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        ensure!(
            cache_shape.len() == 4 && cache_shape[0] == 1 && cache_shape[2] == 1,
            "key_cache has shape {cache_shape:?}, expected [1, d_model·layers, 1, positions]"
        );
        let (channels, positions) = (cache_shape[1], cache_shape[3]);
        for (n, _) in &ins {
            let known = matches!(
                n.as_str(),
                "input_ids"
                    | "cache_length"
                    | "key_cache"
                    | "value_cache"
                    | "kv_cache_update_mask"
                    | "decoder_key_padding_mask"
                    | "encoder_output_embeds"
                    | "encoder_attn_key_cache"
                    | "encoder_attn_value_cache"
            );
            ensure!(
                known,
                "input `{n}` is not part of the WhisperKit TextDecoder ABI"
            );
        }
        for need in ["input_ids", "cache_length", "decoder_key_padding_mask"] {
            ensure!(
                ins.iter().any(|(n, _)| n == need),
                "the decoder lacks the input `{need}`"
            );
        }
        let precomputed_cross = ins.iter().any(|(n, _)| n == "encoder_attn_key_cache");
        ensure!(
            precomputed_cross || ins.iter().any(|(n, _)| n == "encoder_output_embeds"),
            "the decoder takes neither encoder_output_embeds nor encoder_attn_key_cache"
        );
        let logits = outs
            .iter()
            .find(|(n, _)| n == "logits")
            .ok_or_else(|| anyhow!("the decoder has no `logits` output"))?;
        let vocab = *fixed_shape("logits", &logits.1)?
            .last()
            .ok_or_else(|| anyhow!("logits is a scalar"))?;
        if kind == CacheKind::Io {
            for o in ["key_cache_updates", "value_cache_updates"] {
                ensure!(
                    outs.iter().any(|(n, _)| n == o),
                    "a cache-I/O decoder must output `{o}`"
                );
            }
        }
        let per_head = outs
            .iter()
            .find(|(n, _)| n == PER_HEAD_ALIGNMENT_OUTPUT)
            .map(|(n, ty)| -> Result<usize> {
                let shape = fixed_shape(n, ty)?;
                ensure!(
                    shape.len() == 3 && shape[0] == 1 && shape[1] >= 1,
                    "`{n}` has shape {shape:?}, expected [1, heads, audio frames]"
                );
                Ok(shape[1])
            })
            .transpose()?;
        let alignment_source = match per_head {
            Some(heads) => Some((PER_HEAD_ALIGNMENT_OUTPUT, heads)),
            None if outs.iter().any(|(n, _)| n == ALIGNMENT_OUTPUT) => Some((ALIGNMENT_OUTPUT, 1)),
            None => None,
        };
        let cache_dims = match kind {
            CacheKind::Io => [1, channels, 1, positions],
            CacheKind::State => [1, 0, 1, 0],
        };
        // A cache declared fp32 (a session computing at fp32) is kept at fp32 on the host.
        let wide_cache = cache_in.is_some_and(|(_, ty)| {
            ty.as_tensor()
                .is_some_and(|t| t.dtype == crate::ir::DType::F32)
        });
        Ok(TextDecoder {
            inputs: ins.into_iter().map(|(n, _)| n).collect(),
            session,
            kind,
            precomputed_cross,
            channels,
            positions,
            vocab,
            key: HostCache::zeros(&cache_dims, wide_cache)?,
            value: HostCache::zeros(&cache_dims, wide_cache)?,
            cross: None,
            observer: None,
            cache_out: false,
            capture_alignment: false,
            alignment: None,
            alignment_source,
        })
    }

    /// Calls `f` after every step with the outputs the decoder does not consume.
    pub fn set_observer(&mut self, f: StepObserver) {
        self.observer = Some(f);
    }

    /// Keeps each step's alignment output (see [`Self::take_alignment`]).
    pub fn capture_alignment(&mut self, on: bool) {
        self.capture_alignment = on;
        self.alignment = None;
    }

    /// Whether steps keep their alignment output ([`Self::capture_alignment`]).
    pub fn capturing_alignment(&self) -> bool {
        self.capture_alignment && self.alignment_source.is_some()
    }

    /// Whether the package has an alignment output (per-head or WhisperKit's mean).
    pub fn has_alignment_output(&self) -> bool {
        self.alignment_source.is_some()
    }

    /// Heads per alignment row: the number of alignment heads when the package has
    /// [`PER_HEAD_ALIGNMENT_OUTPUT`], 1 for WhisperKit's mean `alignment_heads_weights`.
    pub fn alignment_heads(&self) -> usize {
        self.alignment_source.map_or(1, |(_, h)| h)
    }

    /// The last step's alignment row (cross-attention over the audio frames: each head's,
    /// head after head, or their mean), when capture is on and the package has the output.
    pub fn take_alignment(&mut self) -> Option<Vec<f32>> {
        self.alignment.take()
    }

    pub fn kind(&self) -> CacheKind {
        self.kind
    }

    /// Whether the decoder wants the CrossKV model's outputs instead of the encoder output.
    pub fn wants_precomputed_cross(&self) -> bool {
        self.precomputed_cross
    }

    /// Cache positions: the longest sequence, prompt included.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Cache channels (d_model · layers).
    pub fn channels(&self) -> usize {
        self.channels
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Starts a window: clears the caches (host or state) and sets the cross-attention source.
    pub fn begin(&mut self, cross: Cross) -> Result<()> {
        match (&cross, self.precomputed_cross) {
            (Cross::Encoder(_), false) | (Cross::Precomputed { .. }, true) => {}
            (Cross::Encoder(_), true) => {
                bail!("this decoder takes precomputed cross K/V (a CrossKV model is needed)")
            }
            (Cross::Precomputed { .. }, false) => {
                bail!("this decoder takes encoder_output_embeds, not precomputed cross K/V")
            }
        }
        if self.cache_out && self.kind == CacheKind::Io {
            let dims = [1, self.channels, 1, self.positions];
            let wide = self.key.0.dtype() == candle_core::DType::F32;
            self.key = HostCache::zeros(&dims, wide)?;
            self.value = HostCache::zeros(&dims, wide)?;
        } else {
            self.key.clear()?;
            self.value.clear()?;
        }
        self.cache_out = false;
        self.session.reset_states()?;
        self.cross = Some(cross);
        Ok(())
    }

    /// Takes this window's self-attention cache out (host caches moved, no copy; state
    /// values shared): the decoder cannot step until [`Self::put_cache`] or
    /// [`Self::begin`].
    pub fn take_cache(&mut self) -> Result<DecoderCache> {
        ensure!(!self.cache_out, "the decoder's cache is already taken out");
        let data = match self.kind {
            CacheKind::Io => {
                let (kp, vp) = (self.key.placeholder()?, self.value.placeholder()?);
                CacheData::Host {
                    key: std::mem::replace(&mut self.key, kp),
                    value: std::mem::replace(&mut self.value, vp),
                }
            }
            CacheKind::State => CacheData::State(
                self.session
                    .state_names()
                    .into_iter()
                    .map(|n| {
                        let t = self
                            .session
                            .state(n)
                            .ok_or_else(|| anyhow!("no state `{n}`"))?;
                        Ok((n.to_string(), t))
                    })
                    .collect::<Result<_>>()?,
            ),
        };
        self.cache_out = true;
        Ok(DecoderCache(data))
    }

    /// Makes `cache` (taken from this decoder, in this or another window) the one the next
    /// steps read and write.
    pub fn put_cache(&mut self, cache: DecoderCache) -> Result<()> {
        match (cache.0, self.kind) {
            (CacheData::Host { key, value }, CacheKind::Io) => {
                let want = [1, self.channels, 1, self.positions];
                ensure!(
                    key.0.dims() == want && value.0.dims() == want,
                    "a cache of shape {:?} for a decoder of {want:?}",
                    key.0.dims()
                );
                self.key = key;
                self.value = value;
            }
            (CacheData::State(states), CacheKind::State) => {
                for (name, t) in states {
                    self.session.set_state(&name, t)?;
                }
            }
            _ => bail!("a cache of the other kind of decoder (cache I/O vs stateful)"),
        }
        self.cache_out = false;
        Ok(())
    }

    /// Writes positions `at` of a context prefill's caches ([`Prefill::caches`]) into this
    /// window's caches (after [`Self::begin`]); those positions are then not fed. Only a
    /// cache-I/O decoder's caches can be written from outside.
    pub fn prefill(
        &mut self,
        key: &Tensor,
        value: &Tensor,
        at: std::ops::Range<usize>,
    ) -> Result<()> {
        ensure!(
            self.kind == CacheKind::Io,
            "a stateful decoder's caches cannot be prefilled"
        );
        ensure!(
            at.end <= self.positions,
            "prefill past the cache's positions"
        );
        self.key.set_columns("key_cache_prefill", key, at.clone())?;
        self.value.set_columns("value_cache_prefill", value, at)
    }

    fn host<T: candle_core::WithDType>(v: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }

    /// Feeds `token` at cache position `pos`; returns the next-token logits (f32).
    pub fn step(&mut self, token: u32, pos: usize) -> Result<Vec<f32>> {
        ensure!(
            pos < self.positions,
            "position {pos} is past the decoder's {} cache positions",
            self.positions
        );
        ensure!(
            !self.cache_out,
            "TextDecoder::step with its cache taken out (put_cache first)"
        );
        let cross = self
            .cross
            .as_ref()
            .ok_or_else(|| anyhow!("TextDecoder::step before begin"))?;
        let (c, s) = (self.channels, self.positions);
        let id = i32::try_from(token).context("token id out of range")?;
        let mut feed: Vec<(&str, Tensor)> = Vec::with_capacity(self.inputs.len());
        for name in &self.inputs {
            let t = match name.as_str() {
                "input_ids" => Tensor::from_vec(vec![id], 1, &Device::Cpu)?,
                "cache_length" => Tensor::from_vec(vec![pos as i32], 1, &Device::Cpu)?,
                "key_cache" => self.key.tensor()?,
                "value_cache" => self.value.tensor()?,
                "kv_cache_update_mask" => Self::host(
                    (0..s)
                        .map(|j| f16::from_f32((j == pos) as u8 as f32))
                        .collect(),
                    &[1, s],
                )?,
                "decoder_key_padding_mask" => Self::host(
                    (0..s)
                        .map(|j| f16::from_f32(if j <= pos { 0.0 } else { MASK_HIDDEN }))
                        .collect(),
                    &[1, s],
                )?,
                "encoder_output_embeds" => match cross {
                    Cross::Encoder(t) => t.clone(),
                    Cross::Precomputed { .. } => bail!("encoder output missing"),
                },
                "encoder_attn_key_cache" | "encoder_attn_value_cache" => match cross {
                    Cross::Precomputed { key, value } => {
                        if name == "encoder_attn_key_cache" {
                            key.clone()
                        } else {
                            value.clone()
                        }
                    }
                    Cross::Encoder(_) => bail!("precomputed cross K/V missing"),
                },
                other => bail!("no value for decoder input `{other}`"),
            };
            feed.push((name.as_str(), t));
        }
        let out = self
            .session
            .predict(&feed)
            .with_context(|| format!("text decoder at position {pos}"))?;
        let mut logits = None;
        let mut rest = Vec::new();
        for (name, t) in out {
            match name.as_str() {
                "logits" => logits = Some(t),
                "key_cache_updates" | "value_cache_updates" if self.kind == CacheKind::Io => {
                    let cache = if name == "key_cache_updates" {
                        &mut self.key
                    } else {
                        &mut self.value
                    };
                    cache.set_column(&name, &t, c, pos)?;
                }
                n if self.capture_alignment
                    && self.alignment_source.is_some_and(|(src, _)| src == n) =>
                {
                    self.alignment = Some(kernels::to_f32_vec(&t)?);
                }
                _ => rest.push((name, t)),
            }
        }
        if let Some(f) = &mut self.observer {
            f(rest)?;
        }
        let logits = logits.ok_or_else(|| anyhow!("the decoder returned no logits"))?;
        // The F16C conversion: candle's fp16 → f32 `to_dtype` converts element by element
        // in software, about 97 µs a token over a 51,864-token vocabulary against 6–12.
        kernels::to_f32_vec(&logits)
    }
}
