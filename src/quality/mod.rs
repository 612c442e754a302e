//! Quality-aware compression, the running half: calibration runs the fp16 model on real
//! audio through milkit's runtime to collect the statistics that data-aware compression
//! weighs errors with (the IR instrumentation lives in `passes::calibrate`). Uses `runtime`,
//! `passes` and `whisper` (audio front end, exporters); builds no graphs of its own.

pub mod calibrate;
