#!/usr/bin/env python
"""faster-whisper on the same clip, for `milkit bench audio --compare-faster-whisper PYTHON`.

    python faster_whisper_bench.py [--model HF_WHISPER_DIR] CLIP.wav [--cache DIR]

--model defaults to $MILKIT_FIXTURES/models/whisper-tiny.en (MILKIT_FIXTURES defaults to
../shared beside the repository), which is what `milkit bench audio AUDIO --compare-faster-whisper`
relies on.

Needs `pip install faster-whisper safetensors numpy` (no torch). faster-whisper runs
CTranslate2 models, and CTranslate2's own converter loads checkpoints through torch; to stay
torch-free this script fills CTranslate2's WhisperSpec from the safetensors file directly
(numpy arrays standing in for the torch modules its Transformers loader walks) and caches the
converted model (float32) under --cache. Conversion is not timed.

Then it transcribes the clip (float32, or int8 with --compute-type int8), greedy (or
--beam-size N beams), one temperature, no timestamps, no VAD, the --language given, and
prints one JSON line on stdout:
    {"load_ms": .., "transcribe_ms": .., "total_ms": .., "text": "..", "threads": N,
     "segments": [{"text": .., "no_speech_prob": .., "avg_logprob": ..}, ..], ..}
With --keep-silent no window is dropped as silence, so its no-speech probability shows.
total_ms counts from interpreter start (imports included) to the end of decoding; time the
whole process from outside for a whole-process comparison.
"""
import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from types import SimpleNamespace as NS  # noqa: E402


def _modules(tensors, prefix, config):
    """A tree of namespaces shaped like transformers' WhisperModel, holding numpy arrays."""

    def lin(name, bias=True):
        w = tensors[f"{name}.weight"]
        b = tensors.get(f"{name}.bias") if bias else None
        return NS(weight=w, bias=b)

    def ln(name):
        return NS(weight=tensors[f"{name}.weight"], bias=tensors[f"{name}.bias"])

    def attn(name):
        return NS(
            q_proj=lin(f"{name}.q_proj"),
            k_proj=lin(f"{name}.k_proj"),
            v_proj=lin(f"{name}.v_proj"),
            out_proj=lin(f"{name}.out_proj"),
        )

    def layers(side, n, cross):
        out = []
        for i in range(n):
            p = f"{prefix}.{side}.layers.{i}"
            layer = NS(
                self_attn=attn(f"{p}.self_attn"),
                self_attn_layer_norm=ln(f"{p}.self_attn_layer_norm"),
                fc1=lin(f"{p}.fc1"),
                fc2=lin(f"{p}.fc2"),
                final_layer_norm=ln(f"{p}.final_layer_norm"),
            )
            if cross:
                layer.encoder_attn = attn(f"{p}.encoder_attn")
                layer.encoder_attn_layer_norm = ln(f"{p}.encoder_attn_layer_norm")
            out.append(layer)
        return out

    enc = NS(
        config=config,
        conv1=lin(f"{prefix}.encoder.conv1"),
        conv2=lin(f"{prefix}.encoder.conv2"),
        embed_positions=NS(weight=tensors[f"{prefix}.encoder.embed_positions.weight"]),
        layer_norm=ln(f"{prefix}.encoder.layer_norm"),
        layers=layers("encoder", config.encoder_layers, False),
    )
    dec = NS(
        config=config,
        embed_tokens=NS(weight=tensors[f"{prefix}.decoder.embed_tokens.weight"]),
        embed_positions=NS(weight=tensors[f"{prefix}.decoder.embed_positions.weight"]),
        layer_norm=ln(f"{prefix}.decoder.layer_norm"),
        layers=layers("decoder", config.decoder_layers, True),
    )
    return enc, dec


def convert(hf_dir, out_dir):
    import numpy as np
    from safetensors.numpy import load_file
    from ctranslate2.converters import transformers as ct2_hf
    from ctranslate2.converters.transformers import WhisperLoader

    # The loader checks `isinstance(module, transformers.Conv1D)` (GPT-2 style layers); with
    # no transformers installed, give it a class nothing here is an instance of.
    if not hasattr(ct2_hf, "transformers"):
        ct2_hf.transformers = NS(Conv1D=type("Conv1D", (), {}))

    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    config = NS(**cfg)
    config.scale_embedding = cfg.get("scale_embedding", False)
    gen_path = os.path.join(hf_dir, "generation_config.json")
    gen = None
    if os.path.exists(gen_path):
        with open(gen_path) as f:
            g = json.load(f)
        gen = NS(
            suppress_tokens=g.get("suppress_tokens", []),
            begin_suppress_tokens=g.get("begin_suppress_tokens", []),
        )
        if "alignment_heads" in g:
            gen.alignment_heads = g["alignment_heads"]
        if "lang_to_id" in g:
            gen.lang_to_id = g["lang_to_id"]

    raw = load_file(os.path.join(hf_dir, "model.safetensors"))
    tensors = {k: np.ascontiguousarray(v.astype(np.float32)) for k, v in raw.items()}
    prefix = "model"
    enc, dec = _modules(tensors, prefix, config)
    head = tensors.get("proj_out.weight", tensors[f"{prefix}.decoder.embed_tokens.weight"])
    model = NS(
        config=config,
        generation_config=gen,
        name_or_path=os.path.basename(os.path.normpath(hf_dir)),
        model=NS(encoder=enc, decoder=dec),
        proj_out=NS(weight=head, bias=None),
    )

    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = dict(tok["model"]["vocab"])
    for t in tok.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    special = [t["content"] for t in tok.get("added_tokens", []) if t.get("special")]
    tokenizer = NS(get_vocab=lambda: vocab, additional_special_tokens=special,
                   convert_tokens_to_ids=lambda t: vocab[t])

    spec = WhisperLoader()(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=None)
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    spec.save(tmp)
    for name in ("tokenizer.json", "preprocessor_config.json"):
        src = os.path.join(hf_dir, name)
        if os.path.exists(src):
            shutil.copy(src, tmp)
    os.replace(tmp, out_dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fixtures = os.environ.get("MILKIT_FIXTURES", os.path.join(repo, "..", "shared"))
    ap.add_argument("--model", default=os.path.join(fixtures, "models", "whisper-tiny.en"),
                    help="Hugging Face Whisper directory (safetensors)")
    ap.add_argument("audio", nargs="?")
    ap.add_argument("--audio", dest="audio_opt")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "milkit", "ct2"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--compute-type", default="float32",
                    help="CTranslate2 compute type: float32 (default) or int8 (weights quantized at load)")
    ap.add_argument("--language", default="en", help="language to force (default en)")
    ap.add_argument("--keep-silent", action="store_true",
                    help="no no-speech or log-probability thresholds: silent windows kept")
    ap.add_argument("--beam-size", type=int, default=1,
                    help="beams (default 1: greedy; faster-whisper's own default is 5)")
    a = ap.parse_args()
    a.audio = a.audio or a.audio_opt
    if not a.audio:
        ap.error("give the audio file")

    name = os.path.basename(os.path.normpath(a.model))
    ct2_dir = os.path.join(a.cache, name + "-float32")
    if not os.path.exists(os.path.join(ct2_dir, "model.bin")):
        os.makedirs(a.cache, exist_ok=True)
        t = time.perf_counter()
        convert(a.model, ct2_dir)
        print(f"converted {a.model} -> {ct2_dir} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        # Conversion is a one-off: restart the clock so it is not counted.
        global T0
        T0 = time.perf_counter()

    from faster_whisper import WhisperModel

    t_load = time.perf_counter()
    model = WhisperModel(ct2_dir, device="cpu", compute_type=a.compute_type, cpu_threads=a.threads)
    t_tx = time.perf_counter()
    segments, _info = model.transcribe(
        a.audio,
        beam_size=a.beam_size,
        best_of=1,
        temperature=0.0,
        language=a.language,
        without_timestamps=True,
        condition_on_previous_text=False,
        vad_filter=False,
        **(dict(no_speech_threshold=None, log_prob_threshold=None) if a.keep_silent else {}),
    )
    segments = list(segments)
    text = "".join(s.text for s in segments).strip()
    t_end = time.perf_counter()
    print(json.dumps({
        "load_ms": (t_tx - t_load) * 1e3,
        "transcribe_ms": (t_end - t_tx) * 1e3,
        "total_ms": (t_end - T0) * 1e3,
        "text": text,
        "threads": a.threads,
        "compute_type": a.compute_type,
        "beam_size": a.beam_size,
        "segments": [{"text": s.text, "no_speech_prob": s.no_speech_prob,
                      "avg_logprob": s.avg_logprob} for s in segments],
    }))


if __name__ == "__main__":
    main()
