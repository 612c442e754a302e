//! A `tokenizer.json` for a synthetic checkpoint, in the form Hugging Face writes Whisper's
//! (byte-level BPE, GPT-2 byte alphabet, the special tokens as `added_tokens`), built from the
//! model's own special-token layout, so a synth checkpoint becomes a complete models folder.
//!
//! The layout follows the vocabulary: `<|endoftext|>` is `eos_token_id` and
//! `<|startoftranscript|>` `decoder_start_token_id` (50256/50257 English-only, 50257/50258
//! multilingual); the language tokens follow (the generation config's `lang_to_id` when
//! given, else as many as the vocabulary leaves: 99, or 100 for 51,866 tokens), then
//! translate, transcribe, startoflm, startofprev, nospeech (v3) or nocaptions, notimestamps,
//! and 1,501 timestamps `<|0.00|>`..`<|30.00|>` up to the end of the vocabulary. The text
//! tokens below `<|endoftext|>` are not Whisper's merges (a real vocabulary is not
//! available offline): ids 0..255 are the 256 byte tokens in GPT-2's order, every later id
//! a distinct lowercase word (every other one with a leading space), so any id decodes to
//! text. `merges` is empty: decoding needs none.

use super::config::{GenerationConfig, WhisperConfig, LANGUAGES};
use super::tokenizer::byte_to_char_table;
use anyhow::{bail, ensure, Result};
use serde_json::{json, Value};

/// Timestamp tokens of every Whisper vocabulary: 0.00 s to 30.00 s in 0.02 s steps.
const TIMESTAMPS: u32 = 1501;

/// The `tokenizer.json` of `cfg`'s vocabulary (see the module doc); an error when the
/// vocabulary has no Whisper special-token layout.
pub fn synth_tokenizer_json(cfg: &WhisperConfig, gen: Option<&GenerationConfig>) -> Result<Value> {
    let vocab = u32::try_from(cfg.vocab_size)?;
    let eot = cfg.eos_token_id;
    let sot = cfg.decoder_start_token_id;
    ensure!(
        sot == eot + 1,
        "no Whisper token layout: <|startoftranscript|> ({sot}) does not follow <|endoftext|> ({eot})"
    );
    let langs: Vec<String> = match gen.and_then(|g| g.lang_to_id.as_ref()) {
        Some(map) if !map.is_empty() => {
            let mut by_id: Vec<(u32, &String)> = map.iter().map(|(k, &v)| (v, k)).collect();
            by_id.sort();
            for (i, (id, tok)) in by_id.iter().enumerate() {
                ensure!(
                    *id == sot + 1 + i as u32,
                    "no Whisper token layout: language token {tok} has id {id}, expected {}",
                    sot + 1 + i as u32
                );
            }
            by_id.into_iter().map(|(_, t)| t.clone()).collect()
        }
        _ => {
            let n = i64::from(vocab) - i64::from(TIMESTAMPS) - i64::from(sot + 1) - 6;
            if !(1..=LANGUAGES.len() as i64).contains(&n) {
                bail!(
                    "no Whisper token layout for a vocabulary of {vocab} tokens with \
                     <|startoftranscript|> = {sot} (it leaves {n} language tokens)"
                );
            }
            LANGUAGES[..n as usize]
                .iter()
                .map(|c| format!("<|{c}|>"))
                .collect()
        }
    };
    let translate = sot + 1 + langs.len() as u32;
    let no_timestamps = translate + 5;
    if let Some(nt) = gen.and_then(|g| g.no_timestamps_token_id) {
        ensure!(
            nt == no_timestamps,
            "no Whisper token layout: generation config's no_timestamps_token_id {nt}, the \
             layout puts <|notimestamps|> at {no_timestamps}"
        );
    }
    ensure!(
        no_timestamps < vocab,
        "no Whisper token layout: <|notimestamps|> ({no_timestamps}) is outside the vocabulary of {vocab}"
    );
    let nospeech = if langs.len() >= 100 {
        "<|nospeech|>"
    } else {
        "<|nocaptions|>"
    };
    let mut added: Vec<(u32, String, bool)> = vec![
        (eot, "<|endoftext|>".into(), true),
        (sot, "<|startoftranscript|>".into(), true),
    ];
    added.extend(
        langs
            .iter()
            .enumerate()
            .map(|(i, t)| (sot + 1 + i as u32, t.clone(), true)),
    );
    for (i, t) in [
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        nospeech,
        "<|notimestamps|>",
    ]
    .iter()
    .enumerate()
    {
        added.push((translate + i as u32, t.to_string(), true));
    }
    for id in no_timestamps + 1..vocab {
        let t = f64::from(id - no_timestamps - 1) * 0.02;
        added.push((id, format!("<|{t:.2}|>"), false));
    }
    let added_json: Vec<Value> = added
        .iter()
        .map(|(id, content, special)| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": !special, "special": special
            })
        })
        .collect();
    let mut vocab_map = serde_json::Map::new();
    for (id, tok) in text_tokens(eot).into_iter().enumerate() {
        vocab_map.insert(tok, json!(id));
    }
    // English-only vocabularies also list <|endoftext|> in the BPE vocabulary (GPT-2's).
    if eot == 50256 {
        vocab_map.insert("<|endoftext|>".into(), json!(eot));
    }
    let special = |name: &str, id: u32| json!({"id": name, "ids": [id], "tokens": [name]});
    let st = |name: &str, type_id: u32| json!({"SpecialToken": {"id": name, "type_id": type_id}});
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_json,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [st("<|startoftranscript|>", 0), st("<|notimestamps|>", 0),
                       {"Sequence": {"id": "A", "type_id": 0}}, st("<|endoftext|>", 0)],
            "pair": [st("<|startoftranscript|>", 0), st("<|notimestamps|>", 0),
                     {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     st("<|endoftext|>", 1)],
            "special_tokens": {
                "<|endoftext|>": special("<|endoftext|>", eot),
                "<|notimestamps|>": special("<|notimestamps|>", no_timestamps),
                "<|startoftranscript|>": special("<|startoftranscript|>", sot)
            }
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
            "vocab": vocab_map,
            "merges": []
        }
    }))
}

/// The `n` text tokens in the GPT-2 byte alphabet: the 256 byte tokens in GPT-2's id order
/// (printable bytes first), then distinct words of two or more letters, even ids with a
/// leading space (`Ġ`).
fn text_tokens(n: u32) -> Vec<String> {
    let table = byte_to_char_table();
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out: Vec<String> = (0..=255u8)
        .filter(|&b| printable(b))
        .chain((0..=255u8).filter(|&b| !printable(b)))
        .map(|b| table[usize::from(b)].to_string())
        .collect();
    out.truncate(n as usize);
    for k in 256..n {
        let k = k - 256;
        // Bijective base 26 from 27 on: every word has at least two letters, none repeats.
        let mut m = k / 2 + 27;
        let mut word = Vec::new();
        while m > 0 {
            m -= 1;
            word.push(b'a' + (m % 26) as u8);
            m /= 26;
        }
        word.reverse();
        let word = String::from_utf8(word).unwrap_or_default();
        out.push(if k % 2 == 0 {
            format!("Ġ{word}")
        } else {
            word
        });
    }
    out
}
