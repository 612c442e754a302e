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
        let (mut pass, logits, limit) = self.feed_prompt(opts, &mut step)?;
        self.sample_into(&mut pass, opts, rng, logits, limit, &mut step)?;
        Ok(pass)
    }

    /// Feeds the prompt of `opts`: the pass so far (prompt, no-speech probability,
    /// temperature), the logits after the prompt and the sequence length limit.
    fn feed_prompt(
        &self,
        opts: &PassOptions,
        step: &mut impl FnMut(u32, usize) -> Result<Vec<f32>>,
    ) -> Result<(Pass, Vec<f32>, usize)> {
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
        let pass = Pass {
            prompt: prompt.tokens,
            no_speech_prob,
            temperature: opts.temperature,
            ..Pass::default()
        };
        Ok((pass, logits, limit))
    }

    /// Samples (greedily at temperature 0) from `logits`, the logits after `pass`'s prompt,
    /// until end-of-text or `limit`.
    fn sample_into(
        &self,
        pass: &mut Pass,
        opts: &PassOptions,
        rng: &mut Rng,
        mut logits: Vec<f32>,
        limit: usize,
        step: &mut impl FnMut(u32, usize) -> Result<Vec<f32>>,
    ) -> Result<()> {
        let mut pos = pass.prompt.len();
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
        Ok(())
    }

    /// One decoding pass with `search`'s rules, as openai-whisper's `DecodingTask`: beam
    /// search at temperature 0 with a beam size above 1, the best of `best_of` samples
    /// above 0, otherwise [`Self::decode`] on sequence 0. The prompt is fed once, into
    /// sequence 0; beams and samples start as copies of it.
    pub fn search(
        &self,
        opts: &PassOptions,
        search: &Search,
        rng: &mut Rng,
        seqs: &mut impl Sequences,
    ) -> Result<Pass> {
        search.check()?;
        let width = search.width(opts.temperature);
        let mut step0 = |t: u32, p: usize| seqs.step(0, t, p);
        if width <= 1 {
            return self.decode(opts, rng, step0);
        }
        let (start, logits, limit) = self.feed_prompt(opts, &mut step0)?;
        if opts.temperature > 0.0 {
            self.best_of(opts, search, width, rng, seqs, start, logits, limit)
        } else {
            self.beam_search(opts, search, width, seqs, start, logits, limit)
        }
    }

    /// `n` independent samples from the shared prompt; the best by [`Search::score`] wins
    /// (the first on ties). Unfinished samples take part, as openai's `GreedyDecoder`.
    #[allow(clippy::too_many_arguments)]
    fn best_of(
        &self,
        opts: &PassOptions,
        search: &Search,
        n: usize,
        rng: &mut Rng,
        seqs: &mut impl Sequences,
        start: Pass,
        logits: Vec<f32>,
        limit: usize,
    ) -> Result<Pass> {
        seqs.reorder(&vec![0; n])?;
        let mut best: Option<(f64, Pass)> = None;
        for i in 0..n {
            let mut pass = start.clone();
            let mut step = |t: u32, p: usize| seqs.step(i, t, p);
            self.sample_into(&mut pass, opts, rng, logits.clone(), limit, &mut step)?;
            let score = search.score(pass.sum_logprob, pass.tokens.len());
            if best.as_ref().is_none_or(|(s, _)| score > *s) {
                best = Some((score, pass));
            }
        }
        best.map(|(_, p)| p)
            .context("best_of needs at least one sample")
    }

    /// openai-whisper's `BeamSearchDecoder` over the logits after the prompt: at each step
    /// every live beam's `beams + 1` most likely tokens (after the logit filters) are
    /// ranked by cumulative log-probability; the first `beams` that do not end the text
    /// live on, the ones that do are collected as finished candidates until
    /// round(beams · patience) are found. At the length limit the unfinished beams fill the
    /// candidates up to `beams`. The best candidate by [`Search::score`] is returned.
    #[allow(clippy::too_many_arguments)]
    fn beam_search(
        &self,
        opts: &PassOptions,
        search: &Search,
        beams: usize,
        seqs: &mut impl Sequences,
        start: Pass,
        logits: Vec<f32>,
        limit: usize,
    ) -> Result<Pass> {
        /// A hypothesis: its tokens (end-of-text excluded), each token's probability
        /// (end-of-text's last when finished) and their summed log-probability.
        #[derive(Clone, Default)]
        struct Hyp {
            tokens: Vec<u32>,
            probs: Vec<f32>,
            sum: f64,
        }
        let max_candidates = search.max_candidates(beams);
        let prompt_len = start.prompt.len();
        let mut live: Vec<(Hyp, Vec<f32>)> = vec![(Hyp::default(), logits)];
        let mut finished: Vec<Hyp> = Vec::new();
        let mut pos = prompt_len;
        let unfinished = loop {
            // (cumulative log-probability, source beam, token, its log-probability)
            let mut cands: Vec<(f64, usize, u32, f64)> =
                Vec::with_capacity(live.len() * (beams + 1));
            for (j, (hyp, logits)) in live.iter_mut().enumerate() {
                self.apply(logits, &hyp.tokens, opts.timestamps);
                let lse = log_sum_exp(logits);
                for id in top_k(logits, beams + 1) {
                    let lp = f64::from(logits[id as usize]) - lse;
                    cands.push((hyp.sum + lp, j, id, lp));
                }
            }
            ensure!(
                !cands.is_empty(),
                "decoder step {}: no finite logit left to choose",
                pos - prompt_len
            );
            // Stable, as Python's `sorted(..., reverse=True)`: equal scores keep beam order.
            cands.sort_by(|a, b| b.0.total_cmp(&a.0));
            let mut next = Vec::with_capacity(beams);
            let extend = |c: &(f64, usize, u32, f64)| {
                let mut h = live[c.1].0.clone();
                h.probs.push(c.3.exp() as f32);
                h.sum = c.0;
                h
            };
            for c in &cands {
                if self.is_eos(c.2) {
                    if finished.len() < max_candidates {
                        finished.push(extend(c));
                    }
                } else {
                    let mut h = extend(c);
                    h.tokens.push(c.2);
                    next.push((h, c.1));
                    if next.len() == beams {
                        break;
                    }
                }
            }
            let full = next
                .first()
                .is_none_or(|(h, _)| prompt_len + h.tokens.len() >= limit);
            if finished.len() >= max_candidates || full {
                break next.into_iter().map(|(h, _)| h).collect::<Vec<_>>();
            }
            let sources: Vec<usize> = next.iter().map(|&(_, s)| s).collect();
            seqs.reorder(&sources)?;
            live = Vec::with_capacity(next.len());
            for (i, (h, _)) in next.into_iter().enumerate() {
                let token = *h.tokens.last().context("a live beam has a token")?;
                let logits = seqs
                    .step(i, token, pos)
                    .with_context(|| format!("decoder step at position {pos}, beam {i}"))?;
                live.push((h, logits));
            }
            pos += 1;
        };
        let n_finished = finished.len();
        let mut candidates = finished;
        if candidates.len() < beams {
            // Already best first: the beams were kept in order of their score.
            let room = beams - candidates.len();
            candidates.extend(unfinished.into_iter().take(room));
        }
        let mut best: Option<(f64, usize)> = None;
        for (i, h) in candidates.iter().enumerate() {
            let score = search.score(h.sum, h.tokens.len());
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, i));
            }
        }
        let (_, i) = best.context("beam search ended without a candidate")?;
        let h = candidates.swap_remove(i);
        Ok(Pass {
            avg_logprob: h.sum / (h.tokens.len() + 1) as f64,
            sum_logprob: h.sum,
            tokens: h.tokens,
            probs: h.probs,
            finished: i < n_finished,
            ..start
        })
    }
}

/// The decoder a [`DecodingRules::search`] drives: one self-attention cache per live
/// sequence (a beam, or a sample of best-of), numbered from 0.
pub trait Sequences {
    /// Feeds `token` at `pos` into sequence `seq`'s cache; returns the logits after it.
    fn step(&mut self, seq: usize, token: u32, pos: usize) -> Result<Vec<f32>>;
    /// Renumbers the sequences: new sequence `i` continues old sequence `sources[i]`. A
    /// source named twice is copied; one not named is dropped.
    fn reorder(&mut self, sources: &[usize]) -> Result<()>;
}

/// openai-whisper's search options beyond the temperature: `DecodingOptions`' `beam_size`,
/// `patience`, `length_penalty` and `best_of`, with its checks and meaning.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Search {
    /// Beams kept at temperature 0; None (or 1) decodes greedily.
    pub beam_size: Option<usize>,
    /// Beam search stops after round(beam_size · patience) finished candidates (None: 1.0).
    pub patience: Option<f64>,
    /// How candidates are ranked: None divides the summed log-probability by the token
    /// count; α in [0, 1] divides it by ((5 + length) / 6)^α (Google NMT's penalty).
    pub length_penalty: Option<f64>,
    /// Independent samples at temperatures above 0, the best ranked kept (None: 1).
    pub best_of: Option<usize>,
}

impl Search {
    /// openai-whisper's option checks (its `_verify_options` and beam decoder's assertion).
    pub fn check(&self) -> Result<()> {
        ensure!(
            self.beam_size != Some(0),
            "beam_size must be at least 1 (1 decodes greedily)"
        );
        ensure!(self.best_of != Some(0), "best_of must be at least 1");
        if let Some(p) = self.patience {
            ensure!(
                self.beam_size.is_some(),
                "patience requires beam_size to be given"
            );
            ensure!(
                p.is_finite() && p > 0.0,
                "patience {p} is not a finite number above 0"
            );
        }
        if let Some(a) = self.length_penalty {
            ensure!(
                (0.0..=1.0).contains(&a),
                "length_penalty (alpha) {a} is not between 0 and 1"
            );
        }
        if let Some(b) = self.beam_size {
            ensure!(
                self.max_candidates(b) > 0,
                "beam_size {b} with patience {} collects no candidate",
                self.patience.unwrap_or(1.0)
            );
        }
        Ok(())
    }

    /// Sequences decoded together at `temperature`: the beams at 0, best_of above 0
    /// (openai's fallback loop drops best_of at 0 and beam_size above 0).
    pub fn width(&self, temperature: f32) -> usize {
        if temperature > 0.0 {
            self.best_of.unwrap_or(1)
        } else {
            self.beam_size.unwrap_or(1)
        }
    }

    /// Finished candidates beam search collects: round(beams · patience), halves to even
    /// as Python's `round`.
    pub fn max_candidates(&self, beams: usize) -> usize {
        (beams as f64 * self.patience.unwrap_or(1.0)).round_ties_even() as usize
    }

    /// openai's `MaximumLikelihoodRanker` score of a candidate of `length` tokens
    /// (end-of-text excluded) and summed log-probability `sum_logprob`.
    pub fn score(&self, sum_logprob: f64, length: usize) -> f64 {
        let length = length as f64;
        let penalty = match self.length_penalty {
            None => length,
            Some(a) => ((5.0 + length) / 6.0).powf(a),
        };
        sum_logprob / penalty
    }
}

/// The ids of the `k` largest finite logits, largest first (the lower id first on ties).
pub fn top_k(logits: &[f32], k: usize) -> Vec<u32> {
    let mut top: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if k == 0 || !l.is_finite() || (top.len() == k && l <= top[k - 1].0) {
            continue;
        }
        let at = top.partition_point(|&(v, _)| v >= l);
        top.insert(at, (l, i as u32));
        top.truncate(k);
    }
    top.into_iter().map(|(_, i)| i).collect()
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

    /// Sequences whose logits are a function of their own history (the tokens fed so far,
    /// prompt included), so that a beam fed the wrong cache after a reorder gets the wrong
    /// logits. Counts decoder steps.
    struct FakeSeqs<F: Fn(&[u32]) -> Vec<f32>> {
        history: Vec<Vec<u32>>,
        logits: F,
        steps: usize,
    }

    impl<F: Fn(&[u32]) -> Vec<f32>> FakeSeqs<F> {
        fn new(logits: F) -> Self {
            FakeSeqs {
                history: vec![vec![]],
                logits,
                steps: 0,
            }
        }
    }

    impl<F: Fn(&[u32]) -> Vec<f32>> Sequences for FakeSeqs<F> {
        fn step(&mut self, seq: usize, token: u32, pos: usize) -> Result<Vec<f32>> {
            let h = self.history.get_mut(seq).context("no such sequence")?;
            ensure!(
                h.len() == pos,
                "sequence {seq} fed position {pos} after {}",
                h.len()
            );
            h.push(token);
            self.steps += 1;
            Ok((self.logits)(h))
        }
        fn reorder(&mut self, sources: &[usize]) -> Result<()> {
            self.history = sources.iter().map(|&s| self.history[s].clone()).collect();
            Ok(())
        }
    }

    /// Logits of the given probabilities (every other token impossible).
    fn dist(probs: &[(u32, f64)]) -> Vec<f32> {
        let mut l = vec![f32::NEG_INFINITY; VOCAB];
        for &(id, p) in probs {
            l[id as usize] = p.ln() as f32;
        }
        l
    }

    /// After the prompt: A (10) 0.5, B (11) 0.4, C (12) 0.1. After A: end 0.6, D (13) 0.4;
    /// after B: end 0.6, E (14) 0.4; after A D or B E: end 0.99, F (15) 0.01; else end.
    fn tree(h: &[u32]) -> Vec<f32> {
        match h.get(2..).unwrap_or_default() {
            [] => dist(&[(10, 0.5), (11, 0.4), (12, 0.1)]),
            [10] => dist(&[(EOT, 0.6), (13, 0.4)]),
            [11] => dist(&[(EOT, 0.6), (14, 0.4)]),
            [10, 13] | [11, 14] => dist(&[(EOT, 0.99), (15, 0.01)]),
            _ => dist(&[(EOT, 1.0)]),
        }
    }

    fn pass_opts(temperature: f32) -> PassOptions {
        PassOptions {
            language: None,
            task: Task::Transcribe,
            timestamps: false,
            temperature,
            previous: vec![],
            limit: usize::MAX,
        }
    }

    fn beam(beams: usize, patience: Option<f64>, length_penalty: Option<f64>) -> Search {
        Search {
            beam_size: Some(beams),
            patience,
            length_penalty,
            best_of: None,
        }
    }

    fn run_search(
        search: &Search,
        temperature: f32,
        f: impl Fn(&[u32]) -> Vec<f32>,
    ) -> (Pass, usize) {
        let mut seqs = FakeSeqs::new(f);
        let pass = rules()
            .search(&pass_opts(temperature), search, &mut Rng::new(1), &mut seqs)
            .expect("decodes");
        (pass, seqs.steps)
    }

    #[test]
    fn beam_search_finds_the_higher_scoring_sequence() {
        // Greedy takes A (0.5), then B's continuation is never seen: A then end, 0.5·0.6.
        // B then end is 0.4·0.99: better, and beam search with 2 beams finds it.
        let f = |h: &[u32]| match h.get(2..).unwrap_or_default() {
            [] => dist(&[(10, 0.5), (11, 0.4), (12, 0.1)]),
            [10] => dist(&[(EOT, 0.6), (13, 0.4)]),
            [11] => dist(&[(EOT, 0.99), (14, 0.01)]),
            _ => dist(&[(EOT, 1.0)]),
        };
        let (greedy, _) = run_search(&Search::default(), 0.0, f);
        assert_eq!(greedy.tokens, vec![10]);
        let (beam, _) = run_search(&beam(2, None, None), 0.0, f);
        assert_eq!(beam.tokens, vec![11]);
        assert!(beam.finished);
        let want = 0.4f64.ln() + 0.99f64.ln();
        assert!(
            (beam.sum_logprob - want).abs() < 1e-6,
            "{}",
            beam.sum_logprob
        );
        assert!((beam.avg_logprob - want / 2.0).abs() < 1e-6);
        assert_eq!(beam.probs.len(), 2, "the token and the end of text");
        assert!((beam.probs[1] - 0.99).abs() < 1e-6);
        assert!(beam.sum_logprob > greedy.sum_logprob);
    }

    #[test]
    fn one_beam_decodes_as_greedy() {
        let (greedy, g_steps) = run_search(&Search::default(), 0.0, tree);
        let (one, o_steps) = run_search(&beam(1, None, None), 0.0, tree);
        assert_eq!((one.tokens, one.finished), (greedy.tokens, greedy.finished));
        assert!((one.sum_logprob - greedy.sum_logprob).abs() < 1e-9);
        assert_eq!(o_steps, g_steps);
    }

    #[test]
    fn beam_search_stops_at_its_finished_candidates_and_patience_waits_for_more() {
        // Two beams: after step 2, A-end (−1.20) and B-end (−1.43) finish: two candidates,
        // enough at patience 1; A wins (one token each, A's sum is higher).
        let (p1, steps1) = run_search(&beam(2, None, None), 0.0, tree);
        assert_eq!(p1.tokens, vec![10]);
        // Prompt (2 steps), then the two beams' first tokens: 4 decoder steps.
        assert_eq!(steps1, 4);
        // Patience 2 waits for four: A D end and B E end come one step later, and A D end's
        // per-token score (−1.62 / 2) beats A end's (−1.20 / 1).
        let (p2, steps2) = run_search(&beam(2, Some(2.0), None), 0.0, tree);
        assert_eq!(p2.tokens, vec![10, 13]);
        assert_eq!(steps2, 6);
        let want = 0.5f64.ln() + 0.4f64.ln() + 0.99f64.ln();
        assert!((p2.sum_logprob - want).abs() < 1e-6);
        // round(2 · 0.75) = 2 (halves to even: 1.5 → 2), round(2 · 1.25) = 2 (2.5 → 2).
        assert_eq!(beam(2, Some(0.75), None).max_candidates(2), 2);
        assert_eq!(beam(2, Some(1.25), None).max_candidates(2), 2);
        assert_eq!(beam(5, Some(1.5), None).max_candidates(5), 8);
    }

    #[test]
    fn length_penalty_follows_openai_whisper_ranking() {
        let s = |a| beam(5, None, a);
        assert!((s(None).score(-2.0, 4) - -0.5).abs() < 1e-12);
        assert!((s(Some(1.0)).score(-2.0, 4) - -2.0 / 1.5).abs() < 1e-12);
        assert!((s(Some(0.0)).score(-2.0, 4) - -2.0).abs() < 1e-12);
        assert!((s(Some(0.5)).score(-3.0, 7) - -3.0 / 2f64.sqrt()).abs() < 1e-12);
        // With patience 2 the candidates are A (−1.20, 1 token) and A D (−1.62, 2 tokens):
        // per token A D wins; with α = 0 (no normalisation) the higher raw sum, A, wins.
        let (by_length, _) = run_search(&beam(2, Some(2.0), None), 0.0, tree);
        assert_eq!(by_length.tokens, vec![10, 13]);
        let (raw, _) = run_search(&beam(2, Some(2.0), Some(0.0)), 0.0, tree);
        assert_eq!(raw.tokens, vec![10]);
    }

    #[test]
    fn beams_cut_by_the_length_limit_become_candidates() {
        // Never an end of text: at the limit the live beams are the candidates.
        let f = |h: &[u32]| {
            let n = h.len() as u32;
            dist(&[(10 + n % 3, 0.5), (13, 0.3), (14, 0.2)])
        };
        let r = DecodingRules::new(&config(Some(6)), None).expect("valid config");
        let mut seqs = FakeSeqs::new(f);
        let pass = r
            .search(
                &pass_opts(0.0),
                &beam(3, None, None),
                &mut Rng::new(0),
                &mut seqs,
            )
            .expect("decodes");
        assert!(!pass.finished);
        assert_eq!(pass.tokens.len(), 4, "6 positions less the 2-token prompt");
        assert_eq!(pass.probs.len(), 4);
        // The best path takes the 0.5 token every step.
        assert_eq!(pass.tokens, vec![12, 10, 11, 12]);
        assert!((pass.sum_logprob - 4.0 * 0.5f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn one_finished_candidate_is_kept_and_live_beams_fill_the_rest() {
        // Three beams, patience 1/3: one candidate. At step 2, A-end (0.5·0.6), B-end
        // (0.4·0.6) and C-end finish together; only the best is kept, and the search stops.
        // As in openai-whisper, the live beams A D and B E (no end of text yet, so no
        // end-of-text log-probability) then fill the candidates up to the beam size, and
        // A D (ln 0.2 over 2 tokens) beats A-end (ln 0.3 over 1).
        let (p, steps) = run_search(&beam(3, Some(1.0 / 3.0), None), 0.0, tree);
        assert_eq!(steps, 5, "the prompt and the three beams' first tokens");
        assert_eq!(p.tokens, vec![10, 13]);
        assert!(!p.finished);
        assert!((p.sum_logprob - 0.2f64.ln()).abs() < 1e-6);
        // Unnormalised (α = 0), the finished A-end has the best sum.
        let (p, _) = run_search(&beam(3, Some(1.0 / 3.0), Some(0.0)), 0.0, tree);
        assert_eq!(p.tokens, vec![10]);
        assert!(p.finished);
    }

    #[test]
    fn best_of_keeps_the_best_ranked_sample() {
        // At temperature 1 a sample takes A, B or C (0.2, 0.3, 0.5), then ends: C ranks
        // first, and 8 seeded samples draw it (all 8 miss it with probability 0.4 %).
        let f = |h: &[u32]| match h.get(2..).unwrap_or_default() {
            [] => dist(&[(10, 0.2), (11, 0.3), (12, 0.5)]),
            _ => dist(&[(EOT, 1.0)]),
        };
        let search = Search {
            best_of: Some(8),
            ..Search::default()
        };
        let (p, steps) = run_search(&search, 1.0, f);
        assert_eq!(p.tokens, vec![12]);
        assert_eq!(steps, 2 + 8, "the prompt once, then one token per sample");
        // At temperature 0 best_of is not used: greedy.
        let (g, _) = run_search(&search, 0.0, f);
        assert_eq!(g.tokens, vec![12]);
        // And beam_size is not used above 0: one sample.
        let (_, steps) = run_search(&beam(4, None, None), 1.0, f);
        assert_eq!(steps, 3);
    }

    #[test]
    fn search_options_are_checked_as_openai_whisper_does() {
        let bad = [
            beam(0, None, None),
            beam(2, Some(0.0), None),
            beam(2, Some(f64::NAN), None),
            beam(2, None, Some(1.5)),
            beam(2, None, Some(-0.1)),
            beam(1, Some(0.4), None),
            Search {
                patience: Some(2.0),
                ..Search::default()
            },
            Search {
                best_of: Some(0),
                ..Search::default()
            },
        ];
        for s in bad {
            let mut seqs = FakeSeqs::new(tree);
            let r = rules().search(&pass_opts(0.0), &s, &mut Rng::new(0), &mut seqs);
            assert!(r.is_err(), "{s:?} was accepted");
            assert_eq!(seqs.steps, 0, "checked before decoding");
        }
        assert!(beam(5, Some(2.0), Some(1.0)).check().is_ok());
        assert_eq!(
            top_k(&[1.0, f32::NAN, 3.0, 3.0, f32::NEG_INFINITY], 3),
            vec![2, 3, 0]
        );
        assert!(top_k(&[1.0], 0).is_empty());
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
