//! Whisper's tokenizer: reads a Hugging Face `tokenizer.json` (byte-level BPE, GPT-2 byte
//! alphabet), turns token ids back into text, and encodes text (for prompts) with GPT-2's
//! pre-tokenization and the file's BPE merges.
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
    #[serde(default)]
    merges: Vec<Merge>,
}

/// One BPE merge: `"a b"` (older files) or `["a", "b"]` (newer ones).
#[derive(Deserialize)]
#[serde(untagged)]
enum Merge {
    Joined(String),
    Pair(String, String),
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
    /// Merge rank of each pair of symbols (lower merges first).
    merges: HashMap<(String, String), usize>,
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
        super::file_reads::note(path);
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
        // The id table is dense: ids far beyond the number of tokens listed would make a
        // few-byte file allocate a table of millions of entries. Whisper's files may lack
        // the 1501 timestamp ids above the specials, hence the margin.
        let listed = file.model.vocab.len() + file.added_tokens.len();
        ensure!(
            (max_id as usize) < listed + (1 << 16),
            "token id {max_id} is implausibly large for the {listed} tokens listed"
        );
        let mut entries: Vec<Option<Entry>> = Vec::new();
        entries
            .try_reserve_exact(max_id as usize + 1)
            .context("cannot allocate the token table")?;
        entries.resize(max_id as usize + 1, None);
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
        let mut merges = HashMap::with_capacity(file.model.merges.len());
        for (rank, m) in file.model.merges.into_iter().enumerate() {
            let pair = match m {
                Merge::Pair(a, b) => (a, b),
                Merge::Joined(s) => match s.split_once(' ') {
                    Some((a, b)) => (a.to_string(), b.to_string()),
                    None => anyhow::bail!("merge {rank} \"{s}\" is not two symbols"),
                },
            };
            merges.entry(pair).or_insert(rank);
        }
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
            merges,
        })
    }

    /// Encodes text as byte-level BPE tokens (no special tokens): GPT-2's pre-tokenizer
    /// splits it into words, each word's UTF-8 bytes are written in the byte alphabet and
    /// merged by rank. An error when a piece has no token (a vocabulary without the byte
    /// tokens).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let table = byte_to_char_table();
        let mut out = Vec::new();
        for piece in pretokenize(text) {
            let mut symbols: Vec<String> = piece
                .bytes()
                .map(|b| table[usize::from(b)].to_string())
                .collect();
            loop {
                let best = symbols
                    .windows(2)
                    .enumerate()
                    .filter_map(|(i, w)| {
                        self.merges
                            .get(&(w[0].clone(), w[1].clone()))
                            .map(|&r| (r, i))
                    })
                    .min();
                let Some((_, i)) = best else { break };
                let merged = format!("{}{}", symbols[i], symbols[i + 1]);
                symbols.splice(i..i + 2, [merged]);
            }
            for s in symbols {
                let id = self
                    .by_string
                    .get(&s)
                    .with_context(|| format!("no token for \"{s}\" (from \"{piece}\")"))?;
                out.push(*id);
            }
        }
        Ok(out)
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

/// GPT-2's pre-tokenization, the regex
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
/// written out as a scanner (the lookahead is not in Rust's regex crate).
fn pretokenize(text: &str) -> Vec<&str> {
    #[derive(PartialEq)]
    enum Class {
        Letter,
        Number,
        Space,
        Other,
    }
    let class = |c: char| {
        if c.is_alphabetic() {
            Class::Letter
        } else if c.is_numeric() {
            Class::Number
        } else if c.is_whitespace() {
            Class::Space
        } else {
            Class::Other
        }
    };
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let at = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let rest = &text[at(i)..];
        if let Some(c) = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
            .iter()
            .find(|c| rest.starts_with(**c))
        {
            out.push(&rest[..c.len()]);
            i += c.chars().count();
            continue;
        }
        let j = if chars[i].1 == ' ' { i + 1 } else { i };
        if let Some(&(_, c)) = chars.get(j) {
            let k = class(c);
            if k != Class::Space {
                let mut e = j + 1;
                while e < chars.len() && class(chars[e].1) == k {
                    e += 1;
                }
                out.push(&text[at(i)..at(e)]);
                i = e;
                continue;
            }
        }
        // A whitespace run: all of it at the end of the text; before other text, all but its
        // last character (which then joins the next word), unless it is a single character.
        let mut e = i;
        while e < chars.len() && class(chars[e].1) == Class::Space {
            e += 1;
        }
        let end = if e == chars.len() || e - i == 1 {
            e
        } else {
            e - 1
        };
        out.push(&text[at(i)..at(end)]);
        i = end;
    }
    out
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
    fn pretokenizer_splits_as_gpt2() {
        assert_eq!(
            pretokenize("Hello world, it's 2024!  ok\n"),
            vec!["Hello", " world", ",", " it", "'s", " 2024", "!", " ", " ok", "\n"]
        );
        assert_eq!(pretokenize("  a"), vec![" ", " a"]);
        assert_eq!(pretokenize("a\nb"), vec!["a", "\n", "b"]);
        assert!(pretokenize("").is_empty());
    }

    #[test]
    fn encode_applies_merges_by_rank_and_round_trips() {
        let json = r#"{"model": {"vocab": {"Ġ": 0, "h": 1, "i": 2, "Ġh": 3, "Ġhi": 4, "!": 5, "hi": 6},
            "merges": ["Ġ h", ["Ġh", "i"], "h i"]}, "added_tokens": []}"#;
        let t = Tokenizer::from_json(json).expect("valid");
        assert_eq!(t.encode(" hi!").unwrap(), vec![4, 5]);
        assert_eq!(t.encode("hi").unwrap(), vec![6]);
        assert_eq!(t.decode(&t.encode(" hi hi!").unwrap(), true), " hi hi!");
        assert!(t.encode("x").is_err(), "no token for x");
    }

    #[test]
    fn malformed_json_is_an_error() {
        assert!(Tokenizer::from_json("{}").is_err());
        assert!(Tokenizer::from_json(r#"{"model": {"vocab": {"a": "x"}}}"#).is_err());
        assert!(Tokenizer::from_json("not json").is_err());
    }
}
