#!/usr/bin/env bash
# Writes tests/data/audio/ and the seeds of fuzz/corpus/{flac,mp3,ogg,m4a,webm}: the shared
# jfk.wav (16 kHz mono, 11 s, public domain) encoded by ffmpeg into every format that
# `milkit::audio` decodes, at other rates and channel counts so that resampling and downmixing
# are exercised too. Needs ffmpeg with libmp3lame, libvorbis and libopus (Debian's ffmpeg).
# The committed files are the reference; rerunning with another ffmpeg may change their bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
wav="${MILKIT_FIXTURES:-../shared}/audio/jfk.wav"
out=tests/data/audio
mkdir -p "$out"
enc() { ffmpeg -hide_banner -loglevel error -y -i "$wav" -map_metadata -1 -fflags +bitexact "$@"; }
enc -c:a flac "$out/jfk.flac"                                   # lossless, 16 kHz mono
enc -c:a alac "$out/jfk.alac.m4a"                               # lossless in MP4
enc -ar 44100 -ac 2 -c:a libmp3lame -b:a 64k "$out/jfk.mp3"     # LAME tag: gapless
enc -ar 22050 -c:a libvorbis -q:a 2 "$out/jfk.ogg"
enc -c:a libopus -b:a 24k "$out/jfk.opus"                       # Ogg Opus, 48 kHz inside
enc -c:a libopus -b:a 24k "$out/jfk.webm"                       # WebM Opus (browser recordings)
enc -ar 32000 -c:a aac -b:a 48k "$out/jfk.m4a"                  # AAC-LC, priming in an edit list
# Telephone audio: G.711 µ-law at 8 kHz in WAV (Symphonia, not hound, reads it).
enc -t 2 -ar 8000 -c:a pcm_mulaw "$out/jfk-2s.mulaw.wav"
# An AC-3 stream in Matroska: a codec milkit does not decode, for the error message.
enc -t 1 -c:a ac3 -b:a 96k "$out/unsupported-codec.mka"
# Fuzz seeds: one second each.
seed() { local dir=fuzz/corpus/$1; shift; mkdir -p "$dir"; enc -t 1 "$@"; }
seed flac -c:a flac fuzz/corpus/flac/seed-jfk-1s.flac
seed mp3 -ar 44100 -ac 2 -c:a libmp3lame -b:a 32k fuzz/corpus/mp3/seed-jfk-1s-stereo.mp3
seed mp3 -c:a libmp3lame -b:a 24k -write_xing 0 fuzz/corpus/mp3/seed-jfk-1s-noxing.mp3
seed ogg -ar 22050 -c:a libvorbis -q:a 0 fuzz/corpus/ogg/seed-jfk-1s-vorbis.ogg
seed ogg -c:a libopus -b:a 16k fuzz/corpus/ogg/seed-jfk-1s.opus
seed ogg -ac 2 -c:a libopus -b:a 24k fuzz/corpus/ogg/seed-jfk-1s-stereo.opus
seed ogg -c:a flac -f ogg fuzz/corpus/ogg/seed-jfk-1s-flac.oga
seed m4a -c:a aac -b:a 24k fuzz/corpus/m4a/seed-jfk-1s-aac.m4a
seed m4a -c:a alac fuzz/corpus/m4a/seed-jfk-1s-alac.m4a
seed webm -c:a libopus -b:a 16k fuzz/corpus/webm/seed-jfk-1s.webm
