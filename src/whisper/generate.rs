//! Whisper's decoding rules, independent of any model runtime: the special tokens of a
//! vocabulary, the prompt (`<|startofprev|>` + previous text, `<|startoftranscript|>`,
//! language, task, `<|notimestamps|>`), language detection and no-speech probability at the
//! `<|startoftranscript|>` position, the logit filters (suppressed tokens, blank suppression at
//! the start, openai-whisper's timestamp rules), greedy and seeded temperature sampling, and
//! the quality measures the temperature fallback uses (average log-probability, gzip
//! compression ratio). A caller-supplied `step` function returns next-token logits; see
//! `crate::transcribe` for the loop over windows.
//!
//! The rules follow openai-whisper's `decoding.py` and Hugging Face's
//! `WhisperTimeStampLogitsProcessor` (which keeps `<|endoftext|>` selectable at the first
//! step).
use super::config::{GenerationConfig, TokenIds};
use super::tokenizer::Tokenizer;
use anyhow::{bail, ensure, Context, Result};
use std::io::Write;
use std::path::Path;

/// Hugging Face caps Whisper's decoder sequence (prompt included) at its 448 positions.
pub const DEFAULT_MAX_LENGTH: usize = 448;

/// Seconds per timestamp token (and per encoder frame).
pub const TIME_PRECISION: f64 = 0.02;

/// openai-whisper's `max_initial_timestamp` (1.0 s) in timestamp steps, used when the
/// generation config does not say.
pub const DEFAULT_MAX_INITIAL_TIMESTAMP_INDEX: usize = 50;

/// What the decoder is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Task {
    #[default]
    Transcribe,
    Translate,
}

impl Task {
    pub fn name(self) -> &'static str {
        match self {
            Task::Transcribe => "transcribe",
            Task::Translate => "translate",
        }
    }
}

/// One slot of the forced prefix after `<|startoftranscript|>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Language,
    Task,
    NoTimestamps,
    Token(u32),
}

/// The decoding rules of one model, from its generation config (and tokenizer).
#[derive(Debug, Clone)]
pub struct DecodingRules {
    sot: u32,
    eos: Vec<u32>,
    no_timestamps: Option<u32>,
    /// First timestamp id (`<|0.00|>`), right after `<|notimestamps|>`.
    timestamp_begin: Option<u32>,
    no_speech: Option<u32>,
    sot_prev: Option<u32>,
    /// (code without the brackets, token id), in token order.
    languages: Vec<(String, u32)>,
    transcribe: Option<u32>,
    translate: Option<u32>,
    slots: Vec<Slot>,
    suppress: Vec<u32>,
    begin_suppress: Vec<u32>,
    max_initial_timestamp_index: Option<usize>,
    max_length: usize,
}

/// The token sequence fed before sampling starts, and where `<|startoftranscript|>` sits in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub tokens: Vec<u32>,
    pub sot_index: usize,
}

/// Options of one decoding pass over one window.
#[derive(Debug, Clone)]
pub struct PassOptions {
    pub language: Option<u32>,
    pub task: Task,
    pub timestamps: bool,
    /// 0 for greedy; above 0, sampling from softmax(logits / temperature).
    pub temperature: f32,
    /// Text tokens of earlier windows (or an initial prompt), fed after `<|startofprev|>`.
    pub previous: Vec<u32>,
    /// Cap on the whole sequence, prompt included (e.g. the decoder's cache positions).
    pub limit: usize,
}

/// What one decoding pass produced.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    /// The prompt that was fed.
    pub prompt: Vec<u32>,
    /// Sampled tokens, end-of-text excluded.
    pub tokens: Vec<u32>,
    /// Probability of each sampled token under the filtered distribution (end-of-text last,
    /// when it was sampled): one more entry than `tokens` when decoding ended on end-of-text.
    pub probs: Vec<f32>,
    /// Σ log-probabilities of the sampled tokens, end-of-text included (openai's).
    pub sum_logprob: f64,
    /// sum_logprob / (tokens + 1), openai's length normalisation.
    pub avg_logprob: f64,
    /// Probability of the no-speech token at the `<|startoftranscript|>` position.
    pub no_speech_prob: Option<f64>,
    pub temperature: f32,
    /// Whether decoding ended on end-of-text (not on the length limit).
    pub finished: bool,
}

/// A small seeded generator (SplitMix64) so that sampling is reproducible run to run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn lookup(tok: Option<&Tokenizer>, names: &[&str]) -> Option<u32> {
    let tok = tok?;
    names.iter().find_map(|n| tok.token_id(n))
}

impl DecodingRules {
    /// Rules from a generation config; the tokenizer, when given, names the special tokens
    /// the config lacks (`<|nospeech|>`/`<|nocaptions|>`, `<|startofprev|>`).
    pub fn new(config: &GenerationConfig, tok: Option<&Tokenizer>) -> Result<Self> {
        let sot = config
            .decoder_start_token_id
            .context("the generation config lacks decoder_start_token_id")?;
        let eos = match &config.eos_token_id {
            Some(TokenIds::One(id)) => vec![*id],
            Some(TokenIds::Many(ids)) => ids.clone(),
            None => bail!("the generation config lacks eos_token_id"),
        };
        ensure!(!eos.is_empty(), "eos_token_id is an empty list");
        let no_timestamps = config
            .no_timestamps_token_id
            .or_else(|| lookup(tok, &["<|notimestamps|>"]));
        let mut languages: Vec<(String, u32)> = config
            .lang_to_id
            .iter()
            .flatten()
            .map(|(k, &id)| {
                let code = k
                    .trim_start_matches("<|")
                    .trim_end_matches("|>")
                    .to_string();
                (code, id)
            })
            .collect();
        languages.sort_by_key(|&(_, id)| id);
        let task = |name: &str| {
            config
                .task_to_id
                .as_ref()
                .and_then(|m| m.get(name).copied())
        };
        let (transcribe, translate) = (
            task("transcribe").or_else(|| lookup(tok, &["<|transcribe|>"])),
            task("translate").or_else(|| lookup(tok, &["<|translate|>"])),
        );
        let is_language = |id: u32| languages.iter().any(|&(_, l)| l == id);
        let mut forced = config.forced_decoder_ids.clone().unwrap_or_default();
        forced.sort_by_key(|&(pos, _)| pos);
        let mut slots = Vec::new();
        for (pos, id) in forced {
            ensure!(
                pos == slots.len() + 1,
                "forced_decoder_ids must cover consecutive positions from 1; got position {pos} \
                 after {} forced tokens",
                slots.len()
            );
            slots.push(match id {
                None => Slot::Language,
                Some(id) if is_language(id) => Slot::Language,
                Some(id) if Some(id) == transcribe || Some(id) == translate => Slot::Task,
                Some(id) if Some(id) == no_timestamps => Slot::NoTimestamps,
                Some(id) => Slot::Token(id),
            });
        }
        let multilingual = config.is_multilingual.unwrap_or(!languages.is_empty());
        if multilingual && slots.is_empty() {
            // Newer Hugging Face configs drop forced_decoder_ids: language and task follow the
            // start token, as in openai-whisper's sot_sequence.
            slots = vec![Slot::Language, Slot::Task];
        }
        if slots.contains(&Slot::Language) {
            ensure!(
                !languages.is_empty(),
                "forced_decoder_ids leaves a language slot, but the config has no lang_to_id"
            );
        }
        if slots.contains(&Slot::Task) {
            ensure!(
                transcribe.is_some(),
                "forced_decoder_ids has a task slot, but no <|transcribe|> id is known"
            );
        }
        let max_length = config.max_length.unwrap_or(DEFAULT_MAX_LENGTH);
        ensure!(
            max_length > slots.len() + 2,
            "max_length {max_length} leaves no room after the {}-token prompt",
            slots.len() + 2
        );
        let no_speech = lookup(tok, &["<|nospeech|>", "<|nocaptions|>"])
            .or_else(|| no_timestamps.and_then(|nt| nt.checked_sub(1)));
        let sot_prev = config
            .prev_sot_token_id
            .or_else(|| lookup(tok, &["<|startofprev|>"]));
        Ok(Self {
            sot,
            eos,
            no_timestamps,
            timestamp_begin: no_timestamps.map(|nt| nt + 1),
            no_speech,
            sot_prev,
            languages,
            transcribe,
            translate,
            slots,
            suppress: config.suppress_tokens.clone().unwrap_or_default(),
            begin_suppress: config.begin_suppress_tokens.clone().unwrap_or_default(),
            max_initial_timestamp_index: Some(
                config
                    .max_initial_timestamp_index
                    .unwrap_or(DEFAULT_MAX_INITIAL_TIMESTAMP_INDEX),
            ),
            max_length,
        })
    }

    /// Rules from `generation_config.json` alone.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::new(&GenerationConfig::from_file(path)?, None)
            .with_context(|| format!("{}: unusable generation config", path.display()))
    }

    /// Whether the prompt has a language slot (multilingual models).
    pub fn is_multilingual(&self) -> bool {
        self.slots.contains(&Slot::Language)
    }

    /// Whether the prompt has a task slot (translation possible).
    pub fn has_task(&self) -> bool {
        self.slots.contains(&Slot::Task) && self.translate.is_some()
    }

    /// The language codes the model knows, in token order.
    pub fn languages(&self) -> impl Iterator<Item = &str> {
        self.languages.iter().map(|(c, _)| c.as_str())
    }

    /// The language token of `code` (`de`, `<|de|>`); an error for a code the model does
    /// not know, and for any language but English on an English-only model.
    pub fn language_token(&self, code: &str) -> Result<Option<u32>> {
        let code = code.trim_start_matches("<|").trim_end_matches("|>");
        if !self.is_multilingual() {
            ensure!(
                code.eq_ignore_ascii_case("en"),
                "this model is English-only: language \"{code}\" is not available (only \"en\")"
            );
            return Ok(None);
        }
        match self.languages.iter().find(|(c, _)| c == code) {
            Some(&(_, id)) => Ok(Some(id)),
            None => bail!(
                "unknown language code \"{code}\"; this model knows {} languages: {}",
                self.languages.len(),
                self.languages().collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// The code of a language token.
    pub fn language_code(&self, id: u32) -> Option<&str> {
        self.languages
            .iter()
            .find(|&&(_, l)| l == id)
            .map(|(c, _)| c.as_str())
    }

    pub fn sot(&self) -> u32 {
        self.sot
    }

    pub fn eot(&self) -> u32 {
        self.eos[0]
    }

    /// Whether `id` ends decoding.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// The first timestamp id; ids from here on are timestamps.
    pub fn timestamp_begin(&self) -> Option<u32> {
        self.timestamp_begin
    }

    pub fn is_timestamp(&self, id: u32) -> bool {
        self.timestamp_begin.is_some_and(|b| id >= b)
    }

    /// Seconds of a timestamp token.
    pub fn timestamp_seconds(&self, id: u32) -> Option<f64> {
        let b = self.timestamp_begin?;
        (id >= b).then(|| f64::from(id - b) * TIME_PRECISION)
    }

    /// Maximum sequence length, prompt included.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// `<|startoftranscript|>`, the language (multilingual models), the task and, without
    /// timestamps, `<|notimestamps|>`. `language` must be given on a multilingual model.
    pub fn sot_sequence(
        &self,
        language: Option<u32>,
        task: Task,
        timestamps: bool,
    ) -> Result<Vec<u32>> {
        let mut seq = vec![self.sot];
        for slot in &self.slots {
            match *slot {
                Slot::Language => {
                    seq.push(language.context("a multilingual model needs a language token")?)
                }
                Slot::Task => seq.push(match task {
                    Task::Transcribe => self.transcribe.context("no <|transcribe|> token")?,
                    Task::Translate => self
                        .translate
                        .context("this model has no <|translate|> token")?,
                }),
                Slot::NoTimestamps => {}
                Slot::Token(id) => seq.push(id),
            }
        }
        if task == Task::Translate && !self.has_task() {
            bail!("this model cannot translate (its prompt has no task slot)");
        }
        if !timestamps {
            if let Some(nt) = self.no_timestamps {
                seq.push(nt);
            }
        }
        Ok(seq)
    }

    /// The prompt: `<|startofprev|>` and the last `previous` tokens (at most half the
    /// context, as openai: 223 for Whisper's 448 positions) when there are any, then the
    /// sot sequence.
    pub fn prompt(&self, sot_sequence: &[u32], previous: &[u32]) -> Prompt {
        let mut tokens = Vec::new();
        if let (Some(prev), false) = (self.sot_prev, previous.is_empty()) {
            let keep = (self.max_length / 2).saturating_sub(1);
            tokens.push(prev);
            tokens.extend_from_slice(&previous[previous.len().saturating_sub(keep)..]);
        }
        let sot_index = tokens.len();
        tokens.extend_from_slice(sot_sequence);
        Prompt { tokens, sot_index }
    }

    /// Language probabilities from the logits at the `<|startoftranscript|>` position:
    /// softmax over the language tokens only (openai's `detect_language`), best first.
    pub fn language_probs(&self, logits: &[f32]) -> Vec<(String, u32, f64)> {
        let vals: Vec<(usize, f64)> = self
            .languages
            .iter()
            .enumerate()
            .filter_map(|(i, &(_, id))| logits.get(id as usize).map(|&l| (i, f64::from(l))))
            .collect();
        let max = vals
            .iter()
            .map(|&(_, v)| v)
            .fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = vals.iter().map(|&(_, v)| (v - max).exp()).sum();
        let mut out: Vec<(String, u32, f64)> = vals
            .into_iter()
            .map(|(i, v)| {
                let (code, id) = &self.languages[i];
                (code.clone(), *id, (v - max).exp() / total)
            })
            .collect();
        out.sort_by(|a, b| b.2.total_cmp(&a.2));
        out
    }

    /// Probability of the no-speech token under the softmax of `logits` (the unfiltered
    /// logits at the `<|startoftranscript|>` position).
    pub fn no_speech_prob(&self, logits: &[f32]) -> Option<f64> {
        let id = self.no_speech? as usize;
        let x = *logits.get(id)?;
        let lse = log_sum_exp(logits);
        Some((f64::from(x) - lse).exp())
    }

    /// Masks the logits of the next token in place. `generated` holds the tokens sampled so
    /// far in this pass (the prompt excluded). Ids beyond the logits are ignored.
    ///
    /// Without timestamps every timestamp id is masked (as whisper.cpp; Hugging Face leaves
    /// them, which only matters if the model ranks one first after `<|notimestamps|>`). With
    /// timestamps, openai's rules: timestamps come in pairs (except right before
    /// end-of-text), never decrease, the first token is a timestamp no later than
    /// `max_initial_timestamp`, and a timestamp is forced when the timestamp tokens' total
    /// probability beats every text token.
    pub fn apply(&self, logits: &mut [f32], generated: &[u32], timestamps: bool) {
        let n = logits.len();
        let mut mask = |id: u32| {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        };
        self.suppress.iter().copied().for_each(&mut mask);
        if generated.is_empty() {
            self.begin_suppress.iter().copied().for_each(&mut mask);
        }
        let Some(tb) = self.timestamp_begin.map(|b| (b as usize).min(n)) else {
            return;
        };
        if !timestamps {
            logits[tb..].fill(f32::NEG_INFINITY);
            return;
        }
        if let Some(nt) = self.no_timestamps {
            if let Some(l) = logits.get_mut(nt as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        let eot = (self.eot() as usize).min(n);
        let is_ts = |t: u32| t as usize >= tb;
        let last_ts = generated.last().is_some_and(|&t| is_ts(t));
        let penultimate_ts = generated.len() < 2 || is_ts(generated[generated.len() - 2]);
        if last_ts {
            if penultimate_ts {
                logits[tb..].fill(f32::NEG_INFINITY);
            } else {
                logits[..eot].fill(f32::NEG_INFINITY);
            }
        }
        if let Some(&last) = generated.iter().rev().find(|&&t| is_ts(t)) {
            // Never decreasing; a segment that just closed cannot be empty.
            let upto = if last_ts && !penultimate_ts {
                last as usize
            } else {
                last as usize + 1
            };
            logits[tb..upto.min(n)].fill(f32::NEG_INFINITY);
        }
        if generated.is_empty() {
            let eot_logit = logits.get(eot).copied();
            logits[..tb].fill(f32::NEG_INFINITY);
            if let Some(v) = eot_logit {
                logits[eot] = v;
            }
            if let Some(m) = self.max_initial_timestamp_index {
                let last_allowed = tb + m;
                if last_allowed + 1 < n {
                    logits[last_allowed + 1..].fill(f32::NEG_INFINITY);
                }
            }
        }
        let lse = log_sum_exp(logits);
        let ts_lp = log_sum_exp(&logits[tb..]) - lse;
        let text_max = logits[..tb]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        if ts_lp > f64::from(text_max) - lse {
            logits[..tb].fill(f32::NEG_INFINITY);
        }
    }

    /// One decoding pass: feeds the prompt, then samples until end-of-text or the length
    /// limit. `step(token, position)` feeds one token and returns the logits after it.
    /// The no-speech probability is read at the `<|startoftranscript|>` position.
    pub fn decode(
        &self,
        opts: &PassOptions,
        rng: &mut Rng,
        mut step: impl FnMut(u32, usize) -> Result<Vec<f32>>,
    ) -> Result<Pass> {
        let sot_seq = self.sot_sequence(opts.language, opts.task, opts.timestamps)?;
        let prompt = self.prompt(&sot_seq, &opts.previous);
        let limit = self.max_length.min(opts.limit);
        ensure!(
            limit > prompt.tokens.len(),
            "a limit of {limit} tokens leaves no room after the {}-token prompt",
            prompt.tokens.len()
        );
        let mut logits = Vec::new();
        let mut no_speech_prob = None;
        for (pos, &t) in prompt.tokens.iter().enumerate() {
            logits = step(t, pos)?;
            if pos == prompt.sot_index {
                no_speech_prob = self.no_speech_prob(&logits);
            }
        }
        let mut pass = Pass {
            prompt: prompt.tokens.clone(),
            no_speech_prob,
            temperature: opts.temperature,
            ..Pass::default()
        };
        let mut pos = prompt.tokens.len();
        loop {
            self.apply(&mut logits, &pass.tokens, opts.timestamps);
            let next = if opts.temperature > 0.0 {
                sample(&logits, opts.temperature, rng)
            } else {
                argmax(&logits)
            }
            .with_context(|| {
                format!(
                    "decoder step {}: no finite logit left to choose",
                    pass.tokens.len()
                )
            })?;
            let lp = f64::from(logits[next as usize]) - log_sum_exp(&logits);
            pass.sum_logprob += lp;
            pass.probs.push(lp.exp() as f32);
            if self.is_eos(next) {
                pass.finished = true;
                break;
            }
            pass.tokens.push(next);
            if pos + 1 >= limit {
                break;
            }
            logits = step(next, pos).with_context(|| format!("decoder step at position {pos}"))?;
            pos += 1;
        }
        pass.avg_logprob = pass.sum_logprob / (pass.tokens.len() + 1) as f64;
        Ok(pass)
    }
}

/// log Σ exp(x) over the non-NaN elements (the decoding rules' and the fidelity metrics'
/// normaliser over a vocabulary of logits): [`crate::kernels::fastmath::log_sum_exp`].
pub use crate::kernels::fastmath::log_sum_exp;

/// Index of the largest logit, first on ties; NaN and -inf never win. None if nothing is
/// selectable.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    crate::kernels::fastmath::argmax(logits).and_then(|i| u32::try_from(i).ok())
}

/// A token drawn from softmax(logits / temperature) with `rng` (inverse CDF in f64).
pub fn sample(logits: &[f32], temperature: f32, rng: &mut Rng) -> Option<u32> {
    let t = f64::from(temperature);
    let max = f64::from(argmax(logits).map(|i| logits[i as usize])?);
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| {
            if l.is_nan() || l == f32::NEG_INFINITY {
                0.0
            } else {
                ((f64::from(l) - max) / t).exp()
            }
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut u = rng.uniform() * total;
    let mut last = None;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            last = Some(i);
            if u < w {
                return u32::try_from(i).ok();
            }
            u -= w;
        }
    }
    last.and_then(|i| u32::try_from(i).ok())
}

/// openai-whisper's repetition measure: UTF-8 bytes of `text` ÷ bytes of its zlib
/// compression (level 6, as Python's `zlib.compress`). Above 2.4 a window usually loops.
pub fn compression_ratio(text: &str) -> f64 {
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return 0.0;
    }
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
    // Writing into a Vec cannot fail.
    let compressed = enc
        .write_all(bytes)
        .and_then(|_| enc.finish())
        .map(|v| v.len())
        .unwrap_or(bytes.len());
    bytes.len() as f64 / compressed.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: usize = 40;
    const START: u32 = 30;
    const NO_TS: u32 = 35;
    const EOT: u32 = 29;

    fn config(max_length: Option<usize>) -> GenerationConfig {
        GenerationConfig {
            decoder_start_token_id: Some(START),
            forced_decoder_ids: Some(vec![(1, Some(NO_TS))]),
            suppress_tokens: Some(vec![3, 7]),
            begin_suppress_tokens: Some(vec![5, EOT]),
            no_timestamps_token_id: Some(NO_TS),
            eos_token_id: Some(TokenIds::One(EOT)),
            max_length,
            max_initial_timestamp_index: Some(2),
            ..Default::default()
        }
    }

    /// Synthetic logits: a preference order that depends on the step, so each rule changes
    /// the outcome. Ranking (best first): timestamp 37, suppressed 3, then `favourite`, then 7.
    fn fake_logits(favourite: u32) -> Vec<f32> {
        let mut l: Vec<f32> = (0..VOCAB).map(|i| -(i as f32) * 0.01).collect();
        l[37] = 10.0;
        l[3] = 9.0;
        l[favourite as usize] = 8.0;
        l[7] = 7.0;
        l
    }

    fn rules() -> DecodingRules {
        DecodingRules::new(&config(None), None).expect("valid config")
    }

    fn greedy(rules: &DecodingRules, timestamps: bool, f: impl Fn(usize) -> Vec<f32>) -> Pass {
        let opts = PassOptions {
            language: None,
            task: Task::Transcribe,
            timestamps,
            temperature: 0.0,
            previous: vec![],
            limit: usize::MAX,
        };
        rules
            .decode(&opts, &mut Rng::new(0), |_, pos| Ok(f(pos)))
            .expect("decodes")
    }

    #[test]
    fn prompt_and_suppression_without_timestamps() {
        let r = rules();
        assert_eq!(
            r.sot_sequence(None, Task::Transcribe, false).unwrap(),
            vec![START, NO_TS]
        );
        assert_eq!(
            r.sot_sequence(None, Task::Transcribe, true).unwrap(),
            vec![START]
        );
        let mut l = fake_logits(5);
        r.apply(&mut l, &[], false);
        // 37 (timestamp), 3 and 7 (always), 5 and EOT (at the start) are gone.
        for id in [3, 5, 7, EOT, 36, 37, 39] {
            assert_eq!(l[id as usize], f32::NEG_INFINITY, "id {id}");
        }
        assert_eq!(argmax(&l), Some(0));
        let mut l = fake_logits(5);
        r.apply(&mut l, &[0], false);
        assert_eq!(
            argmax(&l),
            Some(5),
            "begin suppression only at the first step"
        );
    }

    #[test]
    fn greedy_stops_at_eot_and_scores_its_tokens() {
        let r = rules();
        // Position 1 is the last prompt token; it wants EOT first (suppressed), then 11, 12.
        let pass = greedy(&r, false, |pos| match pos {
            1 => fake_logits(EOT),
            2 => fake_logits(11),
            3 => fake_logits(12),
            _ => fake_logits(EOT),
        });
        assert_eq!(pass.prompt, vec![START, NO_TS]);
        assert_eq!(pass.tokens, vec![0, 11, 12]);
        assert!(pass.finished);
        assert_eq!(pass.probs.len(), 4, "three tokens and the end of text");
        let want: f64 = pass.probs.iter().map(|&p| f64::from(p).ln()).sum::<f64>() / 4.0;
        assert!((pass.avg_logprob - want).abs() < 1e-6);
    }

    #[test]
    fn greedy_respects_max_length_and_errors() {
        let r = DecodingRules::new(&config(Some(6)), None).expect("valid config");
        let pass = greedy(&r, false, |_| fake_logits(12));
        assert_eq!(pass.tokens, vec![12, 12, 12, 12]);
        assert!(!pass.finished);
        let opts = PassOptions {
            language: None,
            task: Task::Transcribe,
            timestamps: false,
            temperature: 0.0,
            previous: vec![],
            limit: 100,
        };
        assert!(r
            .decode(&opts, &mut Rng::new(0), |_, _| Ok(vec![f32::NAN; VOCAB]))
            .is_err());
        assert!(r
            .decode(&opts, &mut Rng::new(0), |_, _| anyhow::bail!("boom"))
            .is_err());
        assert!(DecodingRules::new(&config(Some(3)), None).is_err());
        let mut bad = config(None);
        bad.eos_token_id = None;
        assert!(DecodingRules::new(&bad, None).is_err());
        let mut bad = config(None);
        bad.decoder_start_token_id = None;
        assert!(DecodingRules::new(&bad, None).is_err());
        let mut bad = config(None);
        bad.forced_decoder_ids = Some(vec![(1, None)]);
        assert!(
            DecodingRules::new(&bad, None).is_err(),
            "a language slot needs lang_to_id"
        );
    }

    #[test]
    fn timestamps_come_first_in_pairs_and_never_decrease() {
        let r = rules();
        // Timestamps are 36.. (36 = 0.00 s, 37 = 0.02 s, ...); max initial index 2.
        let mut l = vec![0.0f32; VOCAB];
        l[39] = 5.0;
        r.apply(&mut l, &[], true);
        assert!(
            l[..36].iter().all(|&v| v == f32::NEG_INFINITY),
            "the first token is a timestamp (end of text is begin-suppressed here)"
        );
        assert_eq!(l[39], f32::NEG_INFINITY, "past max_initial_timestamp");
        assert!(l[36].is_finite() && l[38].is_finite());
        // After the opening timestamp: text only.
        let mut l = vec![0.0f32; VOCAB];
        r.apply(&mut l, &[37], true);
        assert!(l[36..].iter().all(|&v| v == f32::NEG_INFINITY));
        assert!(l[10].is_finite());
        // After text then a timestamp (a segment closed): no text; >= that timestamp.
        // (Timestamps are made unlikely so that their mass does not mask end-of-text too.)
        let mut l = vec![0.0f32; VOCAB];
        l[36..].fill(-5.0);
        r.apply(&mut l, &[36, 10, 38], true);
        assert!(l[..EOT as usize].iter().all(|&v| v == f32::NEG_INFINITY));
        assert!(
            l[EOT as usize].is_finite(),
            "end of text may follow a single timestamp"
        );
        assert_eq!(l[37], f32::NEG_INFINITY);
        assert!(
            l[38].is_finite(),
            "the next segment may start where this one ended"
        );
        // After a pair of timestamps: text only.
        let mut l = vec![0.0f32; VOCAB];
        r.apply(&mut l, &[36, 10, 38, 38], true);
        assert!(l[36..].iter().all(|&v| v == f32::NEG_INFINITY));
        assert!(l[10].is_finite());
        assert_eq!(l[NO_TS as usize], f32::NEG_INFINITY);
    }

    #[test]
    fn timestamp_mass_above_every_text_token_forces_a_timestamp() {
        let r = rules();
        let mut l = vec![-10.0f32; VOCAB];
        l[10] = 1.0; // best single token is text...
        l[36..].fill(0.6); // ...but the four timestamps together outweigh it
        r.apply(&mut l, &[36, 11], true);
        assert!(l[..36].iter().all(|&v| v == f32::NEG_INFINITY));
        let mut l = vec![-10.0f32; VOCAB];
        l[10] = 3.0;
        l[36..].fill(0.6);
        r.apply(&mut l, &[36, 11], true);
        assert!(
            l[10].is_finite(),
            "text wins when it beats the timestamp mass"
        );
    }

    #[test]
    fn sampling_is_seeded_and_follows_the_distribution() {
        let logits = vec![0.0f32, (3.0f32).ln(), f32::NEG_INFINITY, 0.0];
        let mut rng = Rng::new(7);
        let mut counts = [0usize; 4];
        let n = 20_000;
        for _ in 0..n {
            counts[sample(&logits, 1.0, &mut rng).unwrap() as usize] += 1;
        }
        assert_eq!(counts[2], 0);
        // Probabilities 0.2, 0.6, 0, 0.2; binomial sd at n = 20000 is ~0.0035.
        let p1 = counts[1] as f64 / n as f64;
        assert!((p1 - 0.6).abs() < 0.02, "p1 = {p1}");
        let a: Vec<u32> = (0..10)
            .map(|_| sample(&logits, 1.0, &mut Rng::new(3)).unwrap())
            .collect();
        assert!(a.iter().all(|&x| x == a[0]), "same seed, same draw");
    }

    #[test]
    fn compression_ratio_flags_repetition() {
        let plain = "And so my fellow Americans ask not what your country can do for you.";
        assert!(
            compression_ratio(plain) < 1.5,
            "{}",
            compression_ratio(plain)
        );
        let looped = "thank you ".repeat(40);
        assert!(compression_ratio(&looped) > 2.4);
        assert_eq!(compression_ratio(""), 0.0);
    }

    #[test]
    fn language_probabilities_cover_language_tokens_only() {
        let mut c = config(None);
        c.forced_decoder_ids = Some(vec![(1, None), (2, Some(24))]);
        c.lang_to_id = Some([("<|en|>".to_string(), 20), ("<|de|>".to_string(), 21)].into());
        c.task_to_id = Some(
            [
                ("transcribe".to_string(), 24),
                ("translate".to_string(), 23),
            ]
            .into(),
        );
        let r = DecodingRules::new(&c, None).unwrap();
        assert!(r.is_multilingual() && r.has_task());
        let mut l = vec![0.0f32; VOCAB];
        l[0] = 100.0; // a text token never counts
        l[21] = (3.0f32).ln();
        let p = r.language_probs(&l);
        assert_eq!(p[0].0, "de");
        assert!((p[0].2 - 0.75).abs() < 1e-6 && (p[1].2 - 0.25).abs() < 1e-6);
        assert_eq!(r.language_token("de").unwrap(), Some(21));
        assert!(r.language_token("xx").is_err());
        assert_eq!(
            r.sot_sequence(Some(21), Task::Translate, false).unwrap(),
            vec![START, 21, 23, NO_TS]
        );
        let en = rules();
        assert!(en.language_token("en").unwrap().is_none());
        let err = en.language_token("fr").unwrap_err().to_string();
        assert!(err.contains("English-only"), "{err}");
        assert!(en.sot_sequence(None, Task::Translate, false).is_err());
    }

    #[test]
    fn previous_text_goes_after_startofprev_capped_at_half_the_context() {
        let mut c = config(Some(10));
        c.prev_sot_token_id = Some(33);
        let r = DecodingRules::new(&c, None).unwrap();
        let seq = r.sot_sequence(None, Task::Transcribe, true).unwrap();
        let p = r.prompt(&seq, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(p.tokens, vec![33, 3, 4, 5, 6, START]);
        assert_eq!(p.sot_index, 5);
        assert_eq!(r.prompt(&seq, &[]).tokens, vec![START]);
    }
}
