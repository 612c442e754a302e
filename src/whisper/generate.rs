//! Whisper greedy decoding rules, independent of any model runtime: the forced prompt,
//! token suppression (always, at the first position, timestamps) and the stop conditions,
//! driven by a caller-supplied `step` function that returns next-token logits.
use super::config::{GenerationConfig, TokenIds};
use anyhow::{bail, ensure, Context, Result};
use std::path::Path;

/// Hugging Face caps Whisper's decoder sequence (prompt included) at its 448 positions.
pub const DEFAULT_MAX_LENGTH: usize = 448;

/// Greedy decoding in no-timestamps mode.
#[derive(Debug, Clone)]
pub struct GreedyRules {
    prompt: Vec<u32>,
    suppress: Vec<u32>,
    begin_suppress: Vec<u32>,
    /// Ids from here on are timestamps (first id after `<|notimestamps|>`); suppressed.
    first_timestamp: Option<u32>,
    eos: Vec<u32>,
    max_length: usize,
}

impl GreedyRules {
    /// Rules from a generation config. The prompt is the start token followed by the forced
    /// ids in position order, with `<|notimestamps|>` appended when the forced ids lack it
    /// (as HF does when timestamps are off).
    pub fn new(config: &GenerationConfig) -> Result<Self> {
        let mut forced = config.forced_decoder_ids.clone().unwrap_or_default();
        forced.sort_by_key(|&(pos, _)| pos);
        let start = config
            .decoder_start_token_id
            .context("the generation config lacks decoder_start_token_id")?;
        let mut prompt = vec![start];
        for (pos, id) in forced {
            ensure!(
                pos == prompt.len(),
                "forced_decoder_ids must cover consecutive positions from 1; got position {pos} after {} prompt tokens",
                prompt.len()
            );
            let Some(id) = id else {
                bail!(
                    "forced_decoder_ids position {pos} is null (language detection is not supported; \
                     the model needs an explicit language token)"
                );
            };
            prompt.push(id);
        }
        if let Some(nt) = config.no_timestamps_token_id {
            if !prompt.contains(&nt) {
                prompt.push(nt);
            }
        }
        let eos = match &config.eos_token_id {
            Some(TokenIds::One(id)) => vec![*id],
            Some(TokenIds::Many(ids)) => ids.clone(),
            None => bail!("the generation config lacks eos_token_id"),
        };
        ensure!(!eos.is_empty(), "eos_token_id is an empty list");
        let max_length = config.max_length.unwrap_or(DEFAULT_MAX_LENGTH);
        ensure!(
            max_length > prompt.len(),
            "max_length {max_length} leaves no room after the {}-token prompt",
            prompt.len()
        );
        Ok(Self {
            prompt,
            suppress: config.suppress_tokens.clone().unwrap_or_default(),
            begin_suppress: config.begin_suppress_tokens.clone().unwrap_or_default(),
            first_timestamp: config.no_timestamps_token_id.map(|nt| nt + 1),
            eos,
            max_length,
        })
    }

    /// Rules from `generation_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::new(&GenerationConfig::from_file(path)?)
            .with_context(|| format!("{}: unusable generation config", path.display()))
    }

    /// The decoder prompt: start token + forced prefix, e.g. [50257, 50362] for tiny.en.
    pub fn initial_tokens(&self) -> Vec<u32> {
        self.prompt.clone()
    }

    /// Maximum sequence length, prompt included.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// Whether `id` ends decoding.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// Mask logits for the next token in place. `step_index` counts generated tokens (0 for
    /// the first position after the prompt); `_tokens_so_far` is accepted for rules that need
    /// history (none do in no-timestamps mode). Ids beyond the logits are ignored.
    ///
    /// Timestamp ids are masked as whisper.cpp does in no-timestamps mode; HF transformers
    /// leaves them unmasked, which only matters if the model would rank a timestamp first
    /// after `<|notimestamps|>` (on the reference clips they trail the winner by ≥ 7.9).
    pub fn apply(&self, logits: &mut [f32], step_index: usize, _tokens_so_far: &[u32]) {
        let mut mask = |id: u32| {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        };
        self.suppress.iter().copied().for_each(&mut mask);
        if step_index == 0 {
            self.begin_suppress.iter().copied().for_each(&mut mask);
        }
        if let Some(first) = self.first_timestamp {
            if let Some(tail) = logits.get_mut(first as usize..) {
                tail.fill(f32::NEG_INFINITY);
            }
        }
    }

    /// Greedy decoding: starting from [`Self::initial_tokens`], call `step` with the sequence so
    /// far, mask its logits, append the argmax (first index on ties) until an EOS token (kept in
    /// the output) or `max_length` tokens. Returns the whole sequence, prompt included.
    pub fn greedy(&self, step: impl FnMut(&[u32]) -> Result<Vec<f32>>) -> Result<Vec<u32>> {
        self.greedy_limited(self.max_length, step)
    }

    /// [`Self::greedy`] with the sequence also capped at `limit` tokens (a decoder's cache
    /// length may be shorter than the config's `max_length`).
    pub fn greedy_limited(
        &self,
        limit: usize,
        mut step: impl FnMut(&[u32]) -> Result<Vec<f32>>,
    ) -> Result<Vec<u32>> {
        let max_length = self.max_length.min(limit);
        ensure!(
            max_length > self.prompt.len(),
            "a limit of {max_length} tokens leaves no room after the {}-token prompt",
            self.prompt.len()
        );
        let mut tokens = self.initial_tokens();
        while tokens.len() < max_length {
            let step_index = tokens.len() - self.prompt.len();
            let mut logits =
                step(&tokens).with_context(|| format!("decoder step {step_index} failed"))?;
            self.apply(&mut logits, step_index, &tokens);
            let next = argmax(&logits).with_context(|| {
                format!("decoder step {step_index}: no finite logit left to choose")
            })?;
            tokens.push(next);
            if self.is_eos(next) {
                break;
            }
        }
        Ok(tokens)
    }
}

/// Index of the largest logit, first on ties; NaN and -inf never win. None if nothing is
/// selectable.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() || v == f32::NEG_INFINITY {
            continue;
        }
        match best {
            Some((_, b)) if v <= b => {}
            _ => best = Some((i, v)),
        }
    }
    best.and_then(|(i, _)| u32::try_from(i).ok())
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

    #[test]
    fn prompt_and_suppression() {
        let rules = GreedyRules::new(&config(None)).expect("valid config");
        assert_eq!(rules.initial_tokens(), vec![START, NO_TS]);
        assert_eq!(rules.max_length(), DEFAULT_MAX_LENGTH);
        let mut l = fake_logits(5);
        rules.apply(&mut l, 0, &[START, NO_TS]);
        // 37 (timestamp), 3 and 7 (always), 5 and EOT (at the start) are gone.
        for id in [3, 5, 7, EOT, 36, 37, 39] {
            assert_eq!(l[id as usize], f32::NEG_INFINITY, "id {id}");
        }
        assert_eq!(argmax(&l), Some(0));
        let mut l = fake_logits(5);
        rules.apply(&mut l, 1, &[START, NO_TS, 0]);
        assert_eq!(
            argmax(&l),
            Some(5),
            "begin suppression only applies at step 0"
        );
        assert!(
            l[NO_TS as usize].is_finite(),
            "<|notimestamps|> itself is not a timestamp"
        );
    }

    #[test]
    fn greedy_stops_at_eot_and_passes_history() {
        let rules = GreedyRules::new(&config(None)).expect("valid config");
        let mut seen = Vec::new();
        let out = rules
            .greedy(|tokens| {
                seen.push(tokens.to_vec());
                // Wants EOT from the start (must be suppressed at step 0), then 11, 12, EOT.
                let favourite = match tokens.len() {
                    2 => EOT,
                    3 => 11,
                    4 => 12,
                    _ => EOT,
                };
                Ok(fake_logits(favourite))
            })
            .expect("decoding succeeds");
        assert_eq!(out, vec![START, NO_TS, 0, 11, 12, EOT]);
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[2], vec![START, NO_TS, 0, 11]);
    }

    #[test]
    fn greedy_respects_max_length_and_errors() {
        let rules = GreedyRules::new(&config(Some(6))).expect("valid config");
        let out = rules
            .greedy(|_| Ok(fake_logits(12)))
            .expect("decoding succeeds");
        assert_eq!(out, vec![START, NO_TS, 12, 12, 12, 12]);
        assert!(rules.greedy(|_| Ok(vec![f32::NAN; VOCAB])).is_err());
        assert!(rules.greedy(|_| anyhow::bail!("boom")).is_err());
        assert!(GreedyRules::new(&config(Some(2))).is_err());
        let mut bad = config(None);
        bad.forced_decoder_ids = Some(vec![(1, None)]);
        assert!(GreedyRules::new(&bad).is_err());
        let mut bad = config(None);
        bad.eos_token_id = None;
        assert!(GreedyRules::new(&bad).is_err());
        let mut bad = config(None);
        bad.decoder_start_token_id = None;
        assert!(GreedyRules::new(&bad).is_err());
    }

    #[test]
    fn parses_generation_config_shapes() {
        let c: GenerationConfig = serde_json::from_str(
            r#"{"decoder_start_token_id": 1, "eos_token_id": [2, 3], "forced_decoder_ids": [[2, 9], [1, 8]],
                "no_timestamps_token_id": 10, "max_length": 448, "other": true}"#,
        )
        .expect("parses");
        let rules = GreedyRules::new(&c).expect("valid");
        assert_eq!(rules.initial_tokens(), vec![1, 8, 9, 10]);
        assert!(rules.is_eos(3) && !rules.is_eos(4));
    }
}
