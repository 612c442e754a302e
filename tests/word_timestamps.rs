//! Word timestamps against Hugging Face's ASR pipeline (`return_timestamps="word"`): milkit's
//! fp16 encoder and text decoder (built in memory from the real checkpoints) are
//! teacher-forced with the reference's timestamped token sequence; the decoder's per-head
//! `alignment_heads_weights_per_head` rows (milkit's, by default in `export --component
//! all`) go through `whisper::timing` and every word's start and end must be within 0.1 s of
//! the reference for ≥ 90 % of the words of each clip, with a median |difference| ≤ 0.05 s
//! (issue 15), on every reference clip of ≤ 30 s: tiny.en (four English clips) and
//! whisper-base (jfk and the twelve multilingual clips). WhisperKit's mean row (all argmax's
//! packages have) is held to a lower floor.

mod common;

use milkit::convert::export::export_encoder;
use milkit::ir::Opset;
use milkit::runtime::{Session, Tensor};
use milkit::transcribe::decoder::{Cross, TextDecoder};
use milkit::whisper::audio::{self, MelFilters, HOP_LENGTH};
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::decoder::{
    build_decoder, min_head_chunks, CrossKv, DecoderDims, DecoderOptions, KvCache,
    PER_HEAD_ALIGNMENT_OUTPUT,
};
use milkit::whisper::encoder::EncoderAbi;
use milkit::whisper::timing::{word_timestamps, Word};
use milkit::whisper::tokenizer::Tokenizer;
use milkit::whisper::weights::WhisperWeights;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The fp16 encoder and text decoder of a checkpoint, as sessions, plus what the test needs
/// of it. The decoder reports WhisperKit's mean over the alignment heads, or, built with
/// `per_head_alignment`, each head's row as well (`alignment_heads_weights_per_head`).
struct Model {
    encoder: Session,
    decoder: TextDecoder,
    /// The output the rows are read from and the heads per row.
    alignment: (&'static str, usize),
    tokenizer: Tokenizer,
    filters: MelFilters,
    n_mels: usize,
    gen: serde_json::Value,
}

impl Model {
    fn build(ckpt: &Path, per_head: bool) -> Model {
        let enc = export_encoder(
            &Checkpoint::open(ckpt).unwrap(),
            EncoderAbi::WhisperKit,
            Opset::Ios18,
            &mut |_, _| {},
        )
        .unwrap();
        let (cfg, w) = WhisperWeights::open(ckpt).unwrap();
        let dims = DecoderDims::from_config(&cfg);
        let gen = json(&ckpt.join("generation_config.json"));
        let heads = common::alignment_heads(ckpt);
        let alignment = if per_head {
            (PER_HEAD_ALIGNMENT_OUTPUT, heads.len())
        } else {
            ("alignment_heads_weights", 1)
        };
        let opts = DecoderOptions {
            alignment_heads: heads,
            per_head_alignment: per_head,
            head_chunks: min_head_chunks(dims.vocab),
            kv_cache: KvCache::Io,
            cross_kv: CrossKv::InGraph,
        };
        let dec = build_decoder(&dims, &w, &opts, Opset::Ios18).unwrap();
        let decoder = TextDecoder::new(Session::from_model(dec).unwrap()).unwrap();
        assert!(decoder.has_alignment_output());
        assert_eq!(decoder.alignment_heads(), alignment.1);
        let filters = MelFilters::from_preprocessor_config(ckpt.join("preprocessor_config.json"))
            .unwrap()
            .unwrap_or_else(|| MelFilters::slaney(cfg.num_mel_bins).unwrap());
        Model {
            encoder: Session::from_model(enc).unwrap(),
            decoder,
            alignment,
            tokenizer: Tokenizer::from_file(ckpt.join("tokenizer.json")).unwrap(),
            filters,
            n_mels: cfg.num_mel_bins,
            gen,
        }
    }

    fn id(&self, key: &str) -> u32 {
        self.gen[key].as_u64().unwrap_or_else(|| panic!("{key}")) as u32
    }

    /// Teacher-forces `seq` (prompt + generated tokens, end-of-text last) over the audio:
    /// the alignment row of every fed position (all but the last token) and the probability
    /// (softmax over the text vocabulary, as openai-whisper) each position gives the next
    /// token.
    fn force(&mut self, samples: &[f32], seq: &[u32]) -> (Vec<Vec<f32>>, Vec<f32>) {
        let (name, _) = self.encoder.inputs(None).unwrap().remove(0);
        let shape = match &self.encoder.inputs(None).unwrap()[0].1 {
            milkit::ir::ValueType::Tensor(t) => t
                .shape
                .iter()
                .map(|d| match d {
                    milkit::ir::Dim::Fixed(n) => *n,
                    _ => panic!("flexible encoder input"),
                })
                .collect::<Vec<_>>(),
            _ => panic!("encoder input is not a tensor"),
        };
        let mel = audio::log_mel(samples, self.n_mels, Some(&self.filters)).unwrap();
        let mel = Tensor::from_vec(mel, shape, &candle_core::Device::Cpu).unwrap();
        let out = self.encoder.predict(&[(name.as_str(), mel)]).unwrap();
        let enc = out.into_iter().next().unwrap().1;
        let eot = self.id("eos_token_id") as usize;
        let mut probs = vec![];
        let decoder = &mut self.decoder;
        decoder.begin(Cross::Encoder(enc)).unwrap();
        let rows: Arc<Mutex<Vec<Vec<f32>>>> = Arc::default();
        let sink = rows.clone();
        let (output, heads) = self.alignment;
        decoder.set_observer(Box::new(move |outs| {
            let (_, t) = outs
                .into_iter()
                .find(|(n, _)| n == output)
                .unwrap_or_else(|| panic!("{output} output"));
            let v: Vec<f32> = t
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1()?;
            assert_eq!(v.len(), heads * 1500);
            sink.lock().unwrap().push(v);
            Ok(())
        }));
        for (pos, pair) in seq.windows(2).enumerate() {
            let logits = decoder.step(pair[0], pos).unwrap();
            let text = &logits[..eot];
            let max = text.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = text.iter().map(|&x| (x as f64 - max).exp()).sum();
            let next = pair[1] as usize;
            probs.push(if next < eot {
                ((logits[next] as f64 - max).exp() / sum) as f32
            } else {
                0.0
            });
        }
        let all_rows = std::mem::take(&mut *rows.lock().unwrap());
        (all_rows, probs)
    }
}

/// One reference clip's agreement: shares within 0.1 s and median |difference| of starts and
/// ends, and the differences themselves.
#[derive(Debug)]
struct Agreement {
    words: usize,
    start_within: f64,
    end_within: f64,
    start_median: f64,
    end_median: f64,
    starts: Vec<f64>,
    ends: Vec<f64>,
}

fn within(v: &[f64]) -> f64 {
    v.iter().filter(|&&d| d <= 0.1 + 1e-9).count() as f64 / v.len() as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// None when the words themselves differ from the reference's.
fn agreement(ours: &[Word], reference: &serde_json::Value) -> Option<Agreement> {
    let refs = reference["words"].as_array().unwrap();
    let theirs: Vec<(String, f64, f64)> = refs
        .iter()
        .map(|w| {
            (
                w["word"].as_str().unwrap().to_string(),
                w["start"].as_f64().unwrap(),
                w["end"].as_f64().unwrap(),
            )
        })
        .collect();
    let a: Vec<&str> = ours.iter().map(|w| w.word.as_str()).collect();
    let b: Vec<&str> = theirs.iter().map(|w| w.0.as_str()).collect();
    if a != b {
        return None;
    }
    let ds: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .map(|(o, t)| (o.start - t.1).abs())
        .collect();
    let de: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .map(|(o, t)| (o.end - t.2).abs())
        .collect();
    Some(Agreement {
        words: ours.len(),
        start_within: within(&ds),
        end_within: within(&de),
        start_median: median(ds.clone()),
        end_median: median(de.clone()),
        starts: ds,
        ends: de,
    })
}

/// What a run must reach: per clip, the least share of starts (and of ends) within 0.1 s of
/// the reference and the largest median |difference| (s); the same over all words of the
/// model.
#[derive(Clone, Copy)]
struct Bounds {
    clip_within: f64,
    clip_median: f64,
    all_within: f64,
    all_median: f64,
}

/// Issue 15's target (≥ 90 % within 0.1 s, median ≤ 0.05 s), per clip and overall.
const TARGET: Bounds = Bounds {
    clip_within: 0.9,
    clip_median: 0.05,
    all_within: 0.9,
    all_median: 0.05,
};

/// With the decoder's mean over the alignment heads (normalised as one, where openai/HF
/// normalise each head before averaging) the worst clips measure 0.864 (tiny.en
/// librivox_ss01_0870 starts) and 0.06 s (tiny.en ljspeech_LJ001-0006), and tiny.en's starts
/// overall 0.894 (base: 0.947): issue 15's 0.9 per clip is not reached by the mean alone, so
/// it is held to this floor, a little under what it measures.
const MEAN_FLOOR: Bounds = Bounds {
    clip_within: 0.85,
    clip_median: 0.07,
    all_within: 0.88,
    all_median: 0.05,
};

/// Runs every clip, prints the table, and asserts the floor per clip and issue 15's target
/// over all words of the model.
fn check_clips(
    model: &mut Model,
    fx: &Path,
    prefix: &str,
    clips: &[(&str, PathBuf)],
    bounds: Bounds,
) {
    let mut failures = vec![];
    let (mut all_starts, mut all_ends) = (vec![], vec![]);
    let sot = model.id("decoder_start_token_id");
    let eot = model.id("eos_token_id");
    for (clip, wav) in clips {
        // `prefix` is the model's name in the reference files, maybe followed by a label.
        let model_name = prefix.split(' ').next().unwrap_or(prefix);
        let reference = json(&fx.join(format!("reference/{model_name}-{clip}.timestamps.json")));
        let samples = audio::load_audio(wav).unwrap();
        let mut prompt = vec![sot];
        let language = reference["language"].as_str();
        if let Some(lang) = language {
            prompt.push(
                model.gen["lang_to_id"][format!("<|{lang}|>")]
                    .as_u64()
                    .unwrap() as u32,
            );
            prompt.push(model.gen["task_to_id"]["transcribe"].as_u64().unwrap() as u32);
        }
        let generated: Vec<u32> = reference["timestamped_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let mut seq = prompt.clone();
        seq.extend(&generated);
        seq.push(eot);
        let (rows, probs) = model.force(&samples, &seq);
        let num_frames = samples.len() / HOP_LENGTH;
        let fed = &seq[..seq.len() - 1];
        let words = word_timestamps(
            &model.tokenizer,
            fed,
            prompt.len(),
            &probs[prompt.len() - 1..probs.len() - 1],
            &rows,
            model.alignment.1,
            num_frames,
            0.0,
            language,
        )
        .unwrap();
        let Some(a) = agreement(&words, &reference) else {
            let ours: Vec<&str> = words.iter().map(|w| w.word.as_str()).collect();
            failures.push(format!(
                "{clip}: words differ from the reference's: {ours:?} vs {}",
                reference["words"]
            ));
            continue;
        };
        eprintln!(
            "{prefix} {clip:<22} words {:>3}  start: {:>5.1} % within 0.1 s, median {:.3} s  \
             end: {:>5.1} % within 0.1 s, median {:.3} s",
            a.words,
            100.0 * a.start_within,
            a.start_median,
            100.0 * a.end_within,
            a.end_median
        );
        if a.start_within < bounds.clip_within
            || a.end_within < bounds.clip_within
            || a.start_median > bounds.clip_median
            || a.end_median > bounds.clip_median
        {
            failures.push(format!(
                "{clip}: start {:.3} within, median {:.3}; end {:.3}, {:.3}",
                a.start_within, a.start_median, a.end_within, a.end_median
            ));
        }
        all_starts.extend(a.starts);
        all_ends.extend(a.ends);
    }
    let (sw, ew) = (within(&all_starts), within(&all_ends));
    let (sm, em) = (median(all_starts), median(all_ends));
    eprintln!(
        "{prefix} all clips: start {:.1} % within 0.1 s, median {sm:.3} s; end {:.1} %, median \
         {em:.3} s",
        100.0 * sw,
        100.0 * ew
    );
    assert!(
        failures.is_empty(),
        "{prefix}: clips below the floor: {failures:#?}"
    );
    assert!(
        sw >= bounds.all_within
            && ew >= bounds.all_within
            && sm <= bounds.all_median
            && em <= bounds.all_median,
        "{prefix}: over all words, below {:.0} % within 0.1 s or over a median of {} s",
        100.0 * bounds.all_within,
        bounds.all_median
    );
}

fn tiny_clips(fx: &Path) -> Vec<(&'static str, PathBuf)> {
    [
        "jfk",
        "librivox_ss01_0870",
        "ljspeech_LJ001-0001",
        "ljspeech_LJ001-0006",
    ]
    .into_iter()
    .map(|c| (c, fx.join(format!("audio/{c}.wav"))))
    .collect()
}

#[test]
fn tiny_en_word_times_from_the_mean_head_row_are_near_the_hugging_face_pipeline() {
    let Some(fx) = common::fixtures() else { return };
    let mut model = Model::build(&fx.join("models/whisper-tiny.en"), false);
    check_clips(&mut model, &fx, "tiny.en", &tiny_clips(&fx), MEAN_FLOOR);
}

/// milkit's decoder with the per-head output: each of tiny.en's eight heads normalised
/// before averaging, as HF does, meets issue 15's target on every clip.
#[test]
fn tiny_en_word_times_from_the_per_head_output_meet_the_target() {
    let Some(fx) = common::fixtures() else { return };
    let mut model = Model::build(&fx.join("models/whisper-tiny.en"), true);
    assert_eq!(model.alignment.1, 8, "tiny.en has eight alignment heads");
    check_clips(
        &mut model,
        &fx,
        "tiny.en (per head)",
        &tiny_clips(&fx),
        TARGET,
    );
}

fn base_clips(fx: &Path) -> Vec<(&'static str, PathBuf)> {
    let mut clips = vec![("jfk", fx.join("audio/jfk.wav"))];
    for lang in ["de", "es", "fr", "pt"] {
        for i in 0..3 {
            let name: &'static str = Box::leak(format!("fleurs_{lang}_{i:03}").into_boxed_str());
            clips.push((name, fx.join(format!("audio/multilingual/{name}.wav"))));
        }
    }
    clips
}

#[test]
fn base_word_times_from_the_mean_head_row_are_near_the_hugging_face_pipeline_in_five_languages() {
    let Some(fx) = common::fixtures() else { return };
    let Some(base) = common::whisper_base() else {
        return;
    };
    let mut model = Model::build(&base, false);
    let clips = base_clips(&fx);
    check_clips(&mut model, &fx, "base", &clips, MEAN_FLOOR);
}

#[test]
fn base_word_times_from_the_per_head_output_meet_the_target_in_five_languages() {
    let Some(fx) = common::fixtures() else { return };
    let Some(base) = common::whisper_base() else {
        return;
    };
    let mut model = Model::build(&base, true);
    check_clips(&mut model, &fx, "base (per head)", &base_clips(&fx), TARGET);
}

// ---- The pieces, on small hand-worked examples (no fixtures needed). ----

use milkit::whisper::timing::{
    dtw, jump_times, median_filter, merge_punctuations, split_on_unicode, split_words,
    APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS,
};

#[test]
fn median_filter_reflects_at_the_edges() {
    // Width 3: padded [5, 1,5,2,8,3, 8] → medians of each window of three.
    let x = [1.0, 5.0, 2.0, 8.0, 3.0];
    assert_eq!(median_filter(&x, 5, 3).unwrap(), [5.0, 2.0, 5.0, 3.0, 8.0]);
    // Width 7: padded [8,2,5, 1,5,2,8,3, 8,2,5].
    assert_eq!(median_filter(&x, 5, 7).unwrap(), [5.0, 3.0, 5.0, 3.0, 5.0]);
    // Each row on its own; rows no longer than width / 2 unchanged.
    let two = [1.0, 5.0, 2.0, 8.0, 3.0, 3.0, 8.0, 2.0, 5.0, 1.0];
    assert_eq!(
        median_filter(&two, 5, 3).unwrap(),
        [5.0, 2.0, 5.0, 3.0, 8.0, 8.0, 3.0, 5.0, 2.0, 5.0]
    );
    assert_eq!(
        median_filter(&[3.0, 1.0, 2.0], 3, 7).unwrap(),
        [3.0, 1.0, 2.0]
    );
    assert!(median_filter(&x, 5, 4).is_err(), "even width");
    assert!(
        median_filter(&x, 3, 3).is_err(),
        "5 values are not rows of 3"
    );
}

#[test]
fn dtw_follows_the_cheapest_path_and_breaks_ties_to_the_right() {
    // Costs [[0, 1, 1], [1, 0, 0]]: token 0 takes frame 0, token 1 frames 1 and 2.
    let (rows, cols) = dtw(&[0.0, 1.0, 1.0, 1.0, 0.0, 0.0], 2, 3).unwrap();
    assert_eq!((rows, cols), (vec![0, 1, 1], vec![0, 1, 2]));
    // All ties: from (2, 2) right to (2, 1), then down (the only way) and diagonal.
    let (rows, cols) = dtw(&[0.0; 4], 2, 2).unwrap();
    assert_eq!((rows, cols), (vec![0, 1, 1], vec![0, 0, 1]));
    // More tokens than frames: tokens share frames.
    let (rows, cols) = dtw(&[0.0, 1.0, 0.0], 3, 1).unwrap();
    assert_eq!((rows, cols), (vec![0, 1, 2], vec![0, 0, 0]));
    assert!(dtw(&[0.0; 5], 2, 3).is_err());
}

/// Row r of `n` rows over `frames` encoder frames: 1 on frames [r·w, (r+1)·w), else 0.
fn block_rows(n: usize, w: usize, frames: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|r| {
            (0..frames)
                .map(|f| if f / w == r { 1.0 } else { 0.0 })
                .collect()
        })
        .collect()
}

#[test]
fn jump_times_are_the_first_frame_of_each_row_and_ignore_frames_past_the_audio() {
    // Four rows, 25 frames each, over 1500 frames; the audio ends at frame 100 (200 mel).
    let mut rows = block_rows(4, 25, 1500);
    // Beyond the audio, row 0 is loud: it must not matter.
    rows[0][100..].fill(5.0);
    let j = jump_times(&rows, 1, 200).unwrap();
    let want = [0.0, 0.5, 1.0, 1.5];
    for (a, b) in j.iter().zip(want) {
        assert!((a - b).abs() < 1e-9, "{j:?}");
    }
    assert!(jump_times(&rows, 1, 1).is_err(), "no frame");
    assert!(jump_times(&[], 1, 200).is_err());
    let mut bad = rows.clone();
    bad[1][3] = f32::NAN;
    assert!(jump_times(&bad, 1, 200).is_err());
}

/// GPT-2's byte alphabet, written out for the test tokenizer (printable Latin-1 as itself,
/// the other bytes from U+0100 on in byte order).
fn gpt2(bytes: &[u8]) -> String {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    bytes
        .iter()
        .map(|&b| {
            if printable(b) {
                char::from(b)
            } else {
                let k = (0..b).filter(|&c| !printable(c)).count() as u32;
                char::from_u32(256 + k).unwrap()
            }
        })
        .collect()
}

/// ids: 0 " And", 1 " so", 2 " fel", 3 "low", 4 ",", 5 ".", 6 " (", 7 "Hi", 8 "\"",
/// 9 [E4] and 10 [BD A0] (你 split), 11 好, 12 " \"", 13 ")", 14 <|endoftext|>,
/// 15 <|notimestamps|>.
fn test_tokenizer() -> Tokenizer {
    let pieces: [&[u8]; 14] = [
        b" And",
        b" so",
        b" fel",
        b"low",
        b",",
        b".",
        b" (",
        b"Hi",
        b"\"",
        &[0xE4],
        &[0xBD, 0xA0],
        "好".as_bytes(),
        b" \"",
        b")",
    ];
    let vocab: serde_json::Map<String, serde_json::Value> = pieces
        .iter()
        .enumerate()
        .map(|(i, p)| (gpt2(p), serde_json::json!(i)))
        .collect();
    let json = serde_json::json!({
        "model": {"vocab": vocab},
        "added_tokens": [
            {"id": 14, "content": "<|endoftext|>", "special": true},
            {"id": 15, "content": "<|notimestamps|>", "special": true},
        ]
    });
    Tokenizer::from_json(&json.to_string()).unwrap()
}

fn words_of(tok: &Tokenizer, ids: &[u32], language: Option<&str>) -> Vec<(String, Vec<usize>)> {
    let mut w = split_words(tok, ids, language);
    merge_punctuations(&mut w, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS);
    w
}

#[test]
fn words_split_at_spaces_with_punctuation_attached() {
    let tok = test_tokenizer();
    let w = words_of(&tok, &[0, 1, 2, 3, 4, 5], None);
    let want: Vec<(String, Vec<usize>)> = vec![
        (" And".into(), vec![0]),
        (" so".into(), vec![1]),
        (" fellow,.".into(), vec![2, 3, 4, 5]),
    ];
    assert_eq!(w, want);
    // An opening mark with a space joins the next word; a closing one the previous.
    let w = words_of(&tok, &[12, 0, 6, 1, 13, 8], Some("en"));
    let want: Vec<(String, Vec<usize>)> = vec![
        (" \" And".into(), vec![0, 1]),
        (" ( so)\"".into(), vec![2, 3, 4, 5]),
    ];
    assert_eq!(w, want);
    // A word without a leading space (the transcript's first) stands alone.
    let w = words_of(&tok, &[7, 0], None);
    assert_eq!(w[0], ("Hi".to_string(), vec![0]));
}

#[test]
fn languages_without_spaces_split_at_complete_characters() {
    let tok = test_tokenizer();
    // 你 needs two tokens before it decodes; 好 is one.
    let pieces = split_on_unicode(&tok, &[9, 10, 11]);
    assert_eq!(
        pieces,
        vec![("你".to_string(), vec![0, 1]), ("好".to_string(), vec![2])]
    );
    assert_eq!(words_of(&tok, &[9, 10, 11], Some("zh")).len(), 2);
    assert_eq!(words_of(&tok, &[9, 10, 11], Some("japanese")).len(), 2);
    // With spaces as boundaries the characters form one word.
    assert_eq!(
        words_of(&tok, &[9, 10, 11], Some("de")),
        vec![("你好".to_string(), vec![0, 1, 2])]
    );
    // A split character left at the end is one last (replacement) piece.
    let p = split_on_unicode(&tok, &[11, 9]);
    assert_eq!(p.len(), 2);
    assert_eq!(p[1].1, vec![1]);
}

#[test]
fn a_token_spans_the_jumps_of_the_row_predicting_it_and_the_row_fed_with_it() {
    let tok = test_tokenizer();
    // Fed: <|notimestamps|> (prompt), " And", " so", " fel", "low"; five rows, 25 frames each.
    let fed = [15, 0, 1, 2, 3];
    let rows = block_rows(5, 25, 1500);
    let probs = [0.5, 0.7, 0.2, 0.4];
    let w = word_timestamps(&tok, &fed, 1, &probs, &rows, 1, 2 * 125, 10.0, None).unwrap();
    let got: Vec<(&str, f64, f64)> = w
        .iter()
        .map(|w| (w.word.as_str(), w.start, w.end))
        .collect();
    // Token fed[t] spans J(t − 1)..J(t), J(r) = r · 0.5 s, plus the offset.
    assert_eq!(
        got,
        vec![
            (" And", 10.0, 10.5),
            (" so", 10.5, 11.0),
            (" fellow", 11.0, 12.0)
        ]
    );
    assert!((w[2].probability - 0.3).abs() < 1e-6);
    assert_eq!(w[2].tokens, vec![2, 3]);
    // A timestamp token (id 20, past <|notimestamps|>) is aligned but in no word.
    let w = word_timestamps(
        &tok,
        &[15, 0, 20, 1],
        1,
        &[0.5, 0.0, 0.7],
        &rows[..4],
        1,
        250,
        0.0,
        None,
    )
    .unwrap();
    let got: Vec<(&str, f64, f64)> = w
        .iter()
        .map(|w| (w.word.as_str(), w.start, w.end))
        .collect();
    assert_eq!(got, vec![(" And", 0.0, 0.5), (" so", 1.0, 1.5)]);
    // Mismatched lengths are errors, not panics.
    assert!(word_timestamps(&tok, &fed, 1, &probs, &rows[1..], 1, 250, 0.0, None).is_err());
    assert!(word_timestamps(&tok, &fed, 1, &probs[1..], &rows, 1, 250, 0.0, None).is_err());
    assert!(word_timestamps(&tok, &fed, 0, &probs, &rows, 1, 250, 0.0, None).is_err());
    // Only special tokens generated: no words.
    assert!(
        word_timestamps(&tok, &[15, 14], 1, &[0.0], &rows[..2], 1, 250, 0.0, None)
            .unwrap()
            .is_empty()
    );
}
