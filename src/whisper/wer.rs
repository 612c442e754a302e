//! Word error rate: the text normalisations used to compare transcripts (ASCII-style for
//! English, Unicode-aware for other languages), and word-level Levenshtein distance summed
//! over a corpus.
use anyhow::{ensure, Result};
use unicode_normalization::UnicodeNormalization;

/// How texts are normalised before words are compared (`milkit eval --normalize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Normalization {
    /// Lowercase, punctuation dropped (dashes and slashes become spaces), letters and digits
    /// kept, whitespace collapsed (`normalize`).
    #[default]
    Ascii,
    /// NFKC, lowercase, Unicode punctuation and symbols replaced by spaces, whitespace
    /// collapsed (`normalize_unicode`; openai-whisper's `BasicTextNormalizer` rule).
    Unicode,
}

impl Normalization {
    /// The rule in words (reports and `--help`).
    pub fn describe(self) -> &'static str {
        match self {
            Normalization::Ascii => "lowercase; punctuation dropped (dashes and slashes become spaces); letters and digits kept; whitespace collapsed",
            Normalization::Unicode => "NFKC; lowercase; Unicode punctuation and symbols become spaces; whitespace collapsed",
        }
    }

    pub fn apply(self, text: &str) -> String {
        match self {
            Normalization::Ascii => normalize(text),
            Normalization::Unicode => normalize_unicode(text),
        }
    }
}

/// Unicode-aware normalisation for any language: NFKC, lowercase, every character of the
/// Unicode punctuation (P*) and symbol (S*) categories replaced by a space, whitespace
/// collapsed — openai-whisper's `BasicTextNormalizer` (less its bracket removal), so
/// "l'homme" is two words, "l homme", as it scores them. Letters with diacritics and
/// combining marks stay ("Für" → "für").
pub fn normalize_unicode(text: &str) -> String {
    let mut cleaned = String::with_capacity(text.len());
    for c in text.nfkc().flat_map(char::to_lowercase) {
        if c.is_whitespace() {
            cleaned.push(' ');
        } else if c.is_alphanumeric() || is_mark(c) {
            cleaned.push(c);
        } else {
            // Punctuation, symbols and controls separate words.
            cleaned.push(' ');
        }
    }
    cleaned.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Combining marks (Mn, Mc, Me): kept as part of their word.
fn is_mark(c: char) -> bool {
    unicode_normalization::char::is_combining_mark(c)
}

/// Normalise a transcript for scoring: lowercase; dashes and slashes become spaces; every other
/// character that is not a letter, digit or whitespace is dropped (so "don't" → "dont",
/// "Mr." → "mr"); whitespace runs collapse to one space, none at the ends.
pub fn normalize(text: &str) -> String {
    let mut cleaned = String::with_capacity(text.len());
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            cleaned.push(c);
        } else if c.is_whitespace() || matches!(c, '-' | '‐' | '‑' | '‒' | '–' | '—' | '―' | '/')
        {
            cleaned.push(' ');
        }
    }
    cleaned.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Word-level edit distance (substitutions + deletions + insertions) between two already
/// normalised word sequences.
pub fn edit_distance<S: PartialEq>(reference: &[S], hypothesis: &[S]) -> usize {
    // One row of the Levenshtein table at a time.
    let mut prev: Vec<usize> = (0..=hypothesis.len()).collect();
    let mut cur = vec![0; hypothesis.len() + 1];
    for (i, r) in reference.iter().enumerate() {
        cur[0] = i + 1;
        for (j, h) in hypothesis.iter().enumerate() {
            let substitute = prev[j] + usize::from(r != h);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[hypothesis.len()]
}

/// Errors and reference word count of one pair, after [`normalize`].
pub fn word_errors(reference: &str, hypothesis: &str) -> (usize, usize) {
    word_errors_with(reference, hypothesis, Normalization::Ascii)
}

/// Errors and reference word count of one pair, after `norm`.
pub fn word_errors_with(reference: &str, hypothesis: &str, norm: Normalization) -> (usize, usize) {
    let r = norm.apply(reference);
    let h = norm.apply(hypothesis);
    let rw: Vec<&str> = r.split(' ').filter(|w| !w.is_empty()).collect();
    let hw: Vec<&str> = h.split(' ').filter(|w| !w.is_empty()).collect();
    (edit_distance(&rw, &hw), rw.len())
}

/// Corpus word errors: (sum of errors, sum of reference words) over aligned pairs. The corpus
/// WER is their ratio (see [`rate`]). The two lists must have the same length.
pub fn wer<R: AsRef<str>, H: AsRef<str>>(refs: &[R], hyps: &[H]) -> Result<(usize, usize)> {
    ensure!(
        refs.len() == hyps.len(),
        "WER needs one hypothesis per reference: {} references, {} hypotheses",
        refs.len(),
        hyps.len()
    );
    Ok(refs.iter().zip(hyps).fold((0, 0), |(e, n), (r, h)| {
        let (de, dn) = word_errors(r.as_ref(), h.as_ref());
        (e + de, n + dn)
    }))
}

/// errors / reference words, or 0 when there are no reference words and no errors (and
/// infinity when there are errors but no reference words).
pub fn rate((errors, words): (usize, usize)) -> f64 {
    match (errors, words) {
        (0, 0) => 0.0,
        (_, 0) => f64::INFINITY,
        (e, n) => e as f64 / n as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_rules() {
        assert_eq!(
            normalize("  Don't   STOP, Mr. Smith!  "),
            "dont stop mr smith"
        );
        assert_eq!(
            normalize("well-known 2-step/3 plan"),
            "well known 2 step 3 plan"
        );
        assert_eq!(
            normalize("It cost $1,000.50 — \"really\"?"),
            "it cost 100050 really"
        );
        assert_eq!(normalize("Café\tNaïve\nÜBER"), "café naïve über");
        assert_eq!(normalize("?!..."), "");
    }

    #[test]
    fn unicode_rule_turns_punctuation_and_symbols_into_word_breaks() {
        assert_eq!(normalize_unicode("L'homme «Für» ÉTÉ!"), "l homme für été");
        assert_eq!(normalize_unicode("São-Paulo, 3€/kg"), "são paulo 3 kg");
        // NFKC first: the ligature and the full-width digit become plain letters/digits.
        assert_eq!(normalize_unicode("ﬁn １"), "fin 1");
        assert_eq!(normalize_unicode("  ¿Qué?\t¡Sí!  "), "qué sí");
    }

    #[test]
    fn edit_distance_counts_each_kind() {
        let w = |s: &'static str| s.split(' ').collect::<Vec<_>>();
        assert_eq!(edit_distance(&w("a b c"), &w("a b c")), 0);
        assert_eq!(edit_distance(&w("a b c"), &w("a x c")), 1); // substitution
        assert_eq!(edit_distance(&w("a b c"), &w("a c")), 1); // deletion
        assert_eq!(edit_distance(&w("a b c"), &w("a b b c")), 1); // insertion
        assert_eq!(edit_distance(&w("a b c d"), &w("b c d e")), 2);
        assert_eq!(edit_distance::<&str>(&[], &w("x y")), 2);
        assert_eq!(edit_distance(&w("x y"), &[]), 2);
        // kitten → sitting at the word level, letters as words: 3.
        assert_eq!(edit_distance(&w("k i t t e n"), &w("s i t t i n g")), 3);
    }

    #[test]
    fn corpus_wer_sums_errors_and_words() {
        let refs = [
            "And so, my fellow Americans.",
            "Ask not what your country can do",
        ];
        let hyps = [
            "and so my fellow american",
            "ask what your country can do for you",
        ];
        // Pair 1: 1 substitution of 5 words; pair 2: 1 deletion + 2 insertions of 7 words.
        let counts = wer(&refs, &hyps).expect("same lengths");
        assert_eq!(counts, (4, 12));
        assert!((rate(counts) - 4.0 / 12.0).abs() < 1e-12);
        assert_eq!(word_errors("Don't-stop", "dont stop"), (0, 2));
        assert!(wer(&refs, &hyps[..1]).is_err());
        assert_eq!(rate((0, 0)), 0.0);
        assert!(rate((1, 0)).is_infinite());
    }
}
