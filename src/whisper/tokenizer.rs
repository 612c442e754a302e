//! Whisper detokenizer: reads a Hugging Face `tokenizer.json` (byte-level BPE, GPT-2 byte
//! alphabet) and turns token ids back into text. Encoding text is not needed to run Whisper
//! and is not implemented.
use anyhow::{ensure, Context, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

#[derive(Deserialize)]
struct TokenizerFile {
    model: ModelSection,
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
}

#[derive(Deserialize)]
struct ModelSection {
    vocab: HashMap<String, u32>,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    special: bool,
}

/// One entry of the id → token table.
#[derive(Debug, Clone)]
enum Entry {
    /// A BPE token, written in the GPT-2 byte alphabet.
    Bpe(String),
    /// An added token, whose content is literal text.
    Added { content: String, special: bool },
}

/// Id ↔ token tables of a byte-level BPE tokenizer.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    entries: Vec<Option<Entry>>,
    by_string: HashMap<String, u32>,
    /// Smallest id of a special added token: every id from here on counts as special, which
    /// covers the timestamp tokens that tokenizer.json does not list.
    first_special: u32,
    /// `<|notimestamps|>`; ids above it that the file lacks are rendered as timestamps.
    no_timestamps: Option<u32>,
    char_to_byte: HashMap<char, u8>,
}

/// GPT-2's reversible byte → printable character table: printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100 onwards, in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(b)
        } else {
            next += 1;
            next - 1
        };
        // Codes are below 0x200, so always valid chars.
        table[usize::from(b)] = char::from_u32(code).unwrap_or('\0');
    }
    table
}

impl Tokenizer {
    /// Load `tokenizer.json`. Errors name the file and the problem.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read tokenizer file", path.display()))?;
        Self::from_json(&text)
            .with_context(|| format!("{}: malformed tokenizer.json", path.display()))
    }

    /// Parse the text of a `tokenizer.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let file: TokenizerFile = serde_json::from_str(text)
            .context("expected an object with `model.vocab` (token → id) and `added_tokens`")?;
        ensure!(!file.model.vocab.is_empty(), "`model.vocab` is empty");
        let max_id = file
            .model
            .vocab
            .values()
            .chain(file.added_tokens.iter().map(|t| &t.id))
            .copied()
            .max()
            .unwrap_or(0);
        ensure!(
            max_id < 10_000_000,
            "token id {max_id} is implausibly large"
        );
        let mut entries: Vec<Option<Entry>> = vec![None; max_id as usize + 1];
        let mut by_string = HashMap::new();
        for (token, &id) in &file.model.vocab {
            entries[id as usize] = Some(Entry::Bpe(token.clone()));
            by_string.insert(token.clone(), id);
        }
        // Added tokens override vocab entries with the same id (GPT-2's <|endoftext|> is both).
        for t in &file.added_tokens {
            entries[t.id as usize] = Some(Entry::Added {
                content: t.content.clone(),
                special: t.special,
            });
            by_string.insert(t.content.clone(), t.id);
        }
        let first_special = file
            .added_tokens
            .iter()
            .filter(|t| t.special)
            .map(|t| t.id)
            .min()
            .unwrap_or(u32::MAX);
        let no_timestamps = by_string.get("<|notimestamps|>").copied();
        let char_to_byte = byte_to_char_table()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        Ok(Self {
            entries,
            by_string,
            first_special,
            no_timestamps,
            char_to_byte,
        })
    }

    /// Id of a token written as in tokenizer.json: an added token's content
    /// (`"<|endoftext|>"`) or a vocab key in the byte alphabet (`"Ġthe"` for " the").
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.by_string.get(token).copied()
    }

    /// Whether `id` is special: a special added token or any id at or above the first one.
    pub fn is_special(&self, id: u32) -> bool {
        id >= self.first_special
            || matches!(
                self.entries.get(id as usize),
                Some(Some(Entry::Added { special: true, .. }))
            )
    }

    /// Number of entries in the table (largest known id + 1).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty (never true for a loaded tokenizer).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Decode ids to text. With `skip_special`, special ids (see [`Self::is_special`]) are
    /// dropped. Otherwise timestamp ids the file lacks appear as `<|1.24|>` and other unknown
    /// ids as `<|id:N|>`. Invalid UTF-8 from split multi-byte characters becomes U+FFFD, as
    /// in Hugging Face tokenizers.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            match self.entries.get(id as usize) {
                Some(Some(Entry::Bpe(token))) => self.push_bpe(token, &mut bytes),
                Some(Some(Entry::Added { content, .. })) => {
                    bytes.extend_from_slice(content.as_bytes())
                }
                _ => {
                    let text = match self.no_timestamps {
                        Some(nt) if id > nt => format!("<|{:.2}|>", f64::from(id - nt - 1) * 0.02),
                        _ => format!("<|id:{id}|>"),
                    };
                    bytes.extend_from_slice(text.as_bytes());
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn push_bpe(&self, token: &str, out: &mut Vec<u8>) {
        // As HF's ByteLevel decoder: a token with a character outside the byte alphabet is
        // kept as its raw UTF-8.
        let mapped: Option<Vec<u8>> = token
            .chars()
            .map(|c| self.char_to_byte.get(&c).copied())
            .collect();
        match mapped {
            Some(b) => out.extend_from_slice(&b),
            None => out.extend_from_slice(token.as_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_and_matches_gpt2_examples() {
        let table = byte_to_char_table();
        let set: std::collections::HashSet<char> = table.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(table[usize::from(b' ')], 'Ġ');
        assert_eq!(table[usize::from(b'\n')], 'Ċ');
        assert_eq!(table[0], 'Ā');
        assert_eq!(table[usize::from(b'a')], 'a');
    }

    fn tiny() -> Tokenizer {
        let json = r#"{"model": {"vocab": {"Ġhello": 0, "Ġw": 1, "orld": 2, "!": 3, "Ã©": 4, "<|endoftext|>": 5}},
            "added_tokens": [
              {"id": 5, "content": "<|endoftext|>", "special": true},
              {"id": 6, "content": "<|notimestamps|>", "special": true}]}"#;
        Tokenizer::from_json(json).expect("valid test tokenizer")
    }

    #[test]
    fn decodes_bytes_and_specials() {
        let t = tiny();
        assert_eq!(t.decode(&[0, 1, 2, 3], true), " hello world!");
        assert_eq!(t.decode(&[0, 4], true), " helloé");
        assert_eq!(t.decode(&[0, 5, 6, 9], true), " hello");
        assert_eq!(
            t.decode(&[0, 5, 6, 9], false),
            " hello<|endoftext|><|notimestamps|><|0.04|>"
        );
        assert!(t.is_special(5) && t.is_special(100) && !t.is_special(4));
        assert_eq!(t.token_id("<|notimestamps|>"), Some(6));
        assert_eq!(t.token_id("Ġw"), Some(1));
        assert_eq!(t.token_id("nope"), None);
    }

    #[test]
    fn malformed_json_is_an_error() {
        assert!(Tokenizer::from_json("{}").is_err());
        assert!(Tokenizer::from_json(r#"{"model": {"vocab": {"a": "x"}}}"#).is_err());
        assert!(Tokenizer::from_json("not json").is_err());
    }
}
