//! Quality-aware compression, the running half: evaluation (corpus WER through the
//! transcription pipeline, with the folder's bits per compressed weight; dense fidelity of a
//! candidate folder against a baseline folder; the go/kill `gate` ladder) and calibration, which runs the fp16 model on real
//! audio through milkit's runtime to collect the statistics that data-aware compression
//! weighs errors with (the IR instrumentation lives in `passes::calibrate`), and the
//! decoder's and the encoder's weights' end-metric sensitivity (`sensitivity`,
//! `encoder_sensitivity`) that mixed-bit plans allocate by. Uses `runtime`,
//! `transcribe`, `passes`, `whisper` (audio front end, exporters), `verify` and `package` (the
//! bits of a folder's packages) and `report` (its report types); builds no graphs of its own.

pub mod bits;
pub mod calibrate;
pub mod encoder_sensitivity;
pub mod eval;
pub mod fidelity;
pub mod gate;
pub mod output_target;
pub mod sensitivity;
pub mod target;
