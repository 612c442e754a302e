//! `milkit._milkit`, the extension behind the `milkit` Python module: a [`Model`] over a
//! runtime session (numpy arrays in and out with `milkit run`'s boundary conversions, the
//! GIL released while a prediction runs), a [`State`] holding a model's Core ML states
//! between predictions, `MilkitError`, and `cli_main`, the whole `milkit` command line.
//! The Python layer (`milkit/__init__.py`) adds coremltools' names and conveniences.

#[path = "../../src/cli/mod.rs"]
mod cli;

use milkit::ir::{ArrayDType, Description, DictKey, Feature, FeatureKind, ShapeFlex};
use milkit::runtime::precision::Compute;
use milkit::runtime::{DType, DictKeys, Output, Session, Tensor};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    Element, PyArray, PyArrayDescrMethods, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// Large blocks (weights, caches) on huge pages, as in the `milkit` binary.
#[global_allocator]
static ALLOC: milkit::alloc::HugePageHint = milkit::alloc::HugePageHint;

create_exception!(
    milkit,
    MilkitError,
    PyRuntimeError,
    "An error of milkit's: a model it cannot load or run, inputs it refuses, a state it \
     does not have. The message is the one the `milkit` command prints."
);

/// A milkit error as the Python exception, with the message `milkit` prints after `error: `.
fn err(e: anyhow::Error) -> PyErr {
    MilkitError::new_err(format!("{e:#}"))
}

fn msg(m: String) -> PyErr {
    MilkitError::new_err(m)
}

/// A value `milkit run` would read from an `.npy` file, from a numpy array: the same dtypes
/// (float32, float16, float64, int32, int64, uint8, bool as uint8), C order.
fn tensor_from_array(name: &str, a: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let u = a.cast::<PyUntypedArray>().map_err(|_| {
        msg(format!(
            "input `{name}`: expected a numpy array, got {}",
            a.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let d = u.dtype();
    let dims = u.shape().to_vec();
    let native = d.is_native_byteorder() != Some(false);
    let t = match (d.kind(), d.itemsize(), native) {
        (b'f', 4, true) => from_typed::<f32>(a, &dims),
        (b'f', 2, true) => from_typed::<half::f16>(a, &dims),
        (b'f', 8, true) => from_typed::<f64>(a, &dims),
        (b'i', 4, true) => from_typed::<i32>(a, &dims),
        (b'i', 8, true) => from_typed::<i64>(a, &dims),
        (b'u', 1, _) => from_typed::<u8>(a, &dims),
        (b'b', 1, _) => {
            let r: PyReadonlyArrayDyn<'_, bool> = a.extract()?;
            let v: Vec<u8> = r.as_array().iter().map(|&b| b as u8).collect();
            Tensor::from_vec(v, dims, &candle_core::Device::Cpu).map_err(anyhow::Error::from)
        }
        _ => {
            return Err(msg(format!(
                "input `{name}`: unsupported dtype {} (float32, float16, float64, int32, int64, \
                 uint8, bool; native byte order)",
                d.str().map(|s| s.to_string()).unwrap_or_default()
            )))
        }
    };
    t.map_err(|e| err(e.context(format!("input `{name}`"))))
}

/// One copy, into the runtime's tensor: straight from the array's buffer when it is
/// C-contiguous, else in C order through its strides.
fn from_typed<T: Element + candle_core::WithDType>(
    a: &Bound<'_, PyAny>,
    dims: &[usize],
) -> anyhow::Result<Tensor> {
    let r: PyReadonlyArrayDyn<'_, T> = a
        .extract()
        .map_err(|e| anyhow::anyhow!("cannot read the array: {e}"))?;
    let dev = &candle_core::Device::Cpu;
    // ndarray's `as_slice` is C order only (numpy's would also take a Fortran-order buffer).
    let v = r.as_array();
    Ok(match v.as_slice() {
        Some(s) => Tensor::from_slice(s, dims, dev)?,
        None => Tensor::from_vec(v.iter().copied().collect(), dims, dev)?,
    })
}

/// A prediction's output after the GIL-free part: tensors already out of the runtime.
enum Host {
    F32(Vec<usize>, Vec<f32>),
    F16(Vec<usize>, Vec<half::f16>),
    F64(Vec<usize>, Vec<f64>),
    I32(Vec<usize>, Vec<i32>),
    I64(Vec<usize>, Vec<i64>),
    U8(Vec<usize>, Vec<u8>),
    U32(Vec<usize>, Vec<u32>),
    Strings(Vec<String>),
    Dict(DictKeys, Vec<f64>),
}

fn to_host(name: &str, v: Output) -> anyhow::Result<Host> {
    use anyhow::Context;
    Ok(match v {
        Output::Tensor(t) => {
            let dims = t.dims().to_vec();
            let flat = t.flatten_all()?;
            let ctx = || format!("output `{name}`");
            match t.dtype() {
                DType::F32 => Host::F32(dims, flat.to_vec1().with_context(ctx)?),
                DType::F16 => Host::F16(dims, flat.to_vec1().with_context(ctx)?),
                DType::F64 => Host::F64(dims, flat.to_vec1().with_context(ctx)?),
                DType::I32 => Host::I32(dims, flat.to_vec1().with_context(ctx)?),
                DType::I64 => Host::I64(dims, flat.to_vec1().with_context(ctx)?),
                DType::U8 => Host::U8(dims, flat.to_vec1().with_context(ctx)?),
                DType::U32 => Host::U32(dims, flat.to_vec1().with_context(ctx)?),
                d => anyhow::bail!("output `{name}`: {d:?} has no numpy dtype"),
            }
        }
        Output::Strings(s) => Host::Strings(s),
        Output::Dict(d) => {
            let values = d.values.to_dtype(DType::F64)?.to_vec1()?;
            Host::Dict(d.keys, values)
        }
    })
}

fn array<'py, T: Element>(py: Python<'py>, dims: Vec<usize>, v: Vec<T>) -> PyResult<Py<PyAny>> {
    let a = ArrayD::from_shape_vec(IxDyn(&dims), v)
        .map_err(|e| msg(format!("an output of shape {dims:?}: {e}")))?;
    // The vector becomes the array's buffer: no copy.
    Ok(PyArray::from_owned_array(py, a).into_any().unbind())
}

/// A host value as Python: a numpy array, a string (a list of them for several), or a
/// dictionary class → probability (int keys for an int64-keyed classifier).
fn to_python(py: Python<'_>, h: Host) -> PyResult<Py<PyAny>> {
    match h {
        Host::F32(d, v) => array(py, d, v),
        Host::F16(d, v) => array(py, d, v),
        Host::F64(d, v) => array(py, d, v),
        Host::I32(d, v) => array(py, d, v),
        Host::I64(d, v) => array(py, d, v),
        Host::U8(d, v) => array(py, d, v),
        Host::U32(d, v) => array(py, d, v),
        Host::Strings(s) => match <[String; 1]>::try_from(s) {
            Ok([one]) => Ok(one.into_pyobject(py)?.into_any().unbind()),
            Err(many) => Ok(PyList::new(py, many)?.into_any().unbind()),
        },
        Host::Dict(keys, values) => {
            let d = PyDict::new(py);
            match keys {
                DictKeys::Str(k) => {
                    for (k, v) in k.into_iter().zip(values) {
                        d.set_item(k, v)?;
                    }
                }
                DictKeys::Int64(k) => {
                    for (k, v) in k.into_iter().zip(values) {
                        d.set_item(k, v)?;
                    }
                }
            }
            Ok(d.into_any().unbind())
        }
    }
}

fn tensor_to_python(py: Python<'_>, name: &str, t: Tensor) -> PyResult<Py<PyAny>> {
    let h = py
        .detach(|| to_host(name, Output::Tensor(t)))
        .map_err(err)?;
    to_python(py, h)
}

fn dtype_name(d: ArrayDType) -> &'static str {
    match d {
        ArrayDType::F16 => "float16",
        ArrayDType::F32 => "float32",
        ArrayDType::F64 => "float64",
        ArrayDType::I32 => "int32",
    }
}

/// One feature of a model description as a dict: name, type, dtype, shape, flexibility
/// (`None`, `{"ranges": [(lo, hi or None), ...]}` or `{"shapes": [...]}`), doc.
fn feature_dict<'py>(py: Python<'py>, f: &Feature) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &f.name)?;
    let (kind, dtype): (&str, Option<&str>) = match f.kind {
        FeatureKind::Array => ("multiArray", Some(dtype_name(f.dtype))),
        FeatureKind::Int64 => ("int64", Some("int64")),
        FeatureKind::Double => ("double", Some("float64")),
        FeatureKind::String => ("string", None),
        FeatureKind::Dict(DictKey::Int64) => ("dictionary", Some("int64")),
        FeatureKind::Dict(DictKey::String) => ("dictionary", Some("str")),
        FeatureKind::Image(_) => ("image", Some("uint8")),
    };
    d.set_item("type", kind)?;
    d.set_item("dtype", dtype)?;
    if let FeatureKind::Image(c) = f.kind {
        d.set_item("color_space", c.name())?;
    }
    d.set_item("shape", f.shape.clone())?;
    match &f.flex {
        ShapeFlex::Fixed => d.set_item("flexible", py.None())?,
        ShapeFlex::Ranges(r) => {
            let fx = PyDict::new(py);
            fx.set_item("ranges", r.clone())?;
            d.set_item("flexible", fx)?;
        }
        ShapeFlex::Enumerated(s) => {
            let fx = PyDict::new(py);
            fx.set_item("shapes", s.clone())?;
            d.set_item("flexible", fx)?;
        }
    }
    d.set_item("doc", &f.doc)?;
    Ok(d)
}

/// Features as Python dicts.
type Dicts<'py> = Vec<Bound<'py, PyDict>>;

/// A function's interface: its own in a multifunction model, else the model's.
fn interface<'d>(
    d: &'d Description,
    function: &str,
) -> (&'d [Feature], &'d [Feature], &'d [Feature]) {
    match d.functions.get(function) {
        Some(io) => (&io.inputs, &io.outputs, &io.states),
        None => (&d.inputs, &d.outputs, &d.states),
    }
}

/// The states of one model, between predictions: a value per state, `None` until
/// predicted with or written (zeros then, as Core ML's `makeState()` gives them).
#[pyclass(module = "milkit", name = "MLState")]
pub struct State {
    /// The model the state was made for (a state is only valid with it).
    owner: usize,
    /// Each state's type: dtype and shape.
    types: BTreeMap<String, (DType, Vec<usize>)>,
    values: Mutex<BTreeMap<String, Tensor>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl State {
    fn value(&self, name: &str) -> PyResult<Tensor> {
        let (dtype, shape) = self.types.get(name).ok_or_else(|| {
            msg(format!(
                "the model has no state `{name}` (states: {})",
                if self.types.is_empty() {
                    "none".to_string()
                } else {
                    self.types.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ))
        })?;
        if let Some(t) = lock(&self.values).get(name) {
            return Ok(t.clone());
        }
        Tensor::zeros(shape.as_slice(), *dtype, &candle_core::Device::Cpu)
            .map_err(|e| err(e.into()))
    }
}

#[pymethods]
impl State {
    /// The current value of state `name`, a new numpy array.
    fn read_state(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        let t = self.value(name)?;
        tensor_to_python(py, name, t)
    }

    /// Replaces state `name` with `value` (a numpy array of the state's shape; converted to
    /// its dtype as a prediction converts inputs).
    fn write_state(&self, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let (dtype, shape) = self
            .types
            .get(name)
            .ok_or_else(|| {
                msg(format!(
                    "the model has no state `{name}` (states: {})",
                    self.types.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            })?
            .clone();
        let t = tensor_from_array(name, value)?;
        if t.dims() != shape.as_slice() {
            return Err(msg(format!(
                "state `{name}` has shape {shape:?}, got {:?}",
                t.dims()
            )));
        }
        let t = milkit::kernels::cast(&t, dtype)
            .map_err(|e| err(e.context(format!("state `{name}`"))))?;
        lock(&self.values).insert(name.to_string(), t);
        Ok(())
    }

    /// The names of the states.
    fn names(&self) -> Vec<String> {
        self.types.keys().cloned().collect()
    }
}

/// A loaded model: one runtime session, one prediction at a time (a second thread waits;
/// load one model per thread to predict in parallel). Predictions run without the GIL.
#[pyclass(module = "milkit._milkit", name = "Model")]
pub struct Model {
    path: PathBuf,
    function: Option<String>,
    session: Mutex<Session>,
    description: Description,
    functions: Vec<String>,
    /// The function predictions run (the given one, else the package's default).
    function_run: String,
    states: BTreeMap<String, (DType, Vec<usize>)>,
}

fn compute(s: &str) -> PyResult<Compute> {
    Ok(match s {
        "package" => Compute::Package,
        "fp32" => Compute::Fp32,
        "bf16" => Compute::Bf16,
        _ => {
            return Err(msg(format!(
                "compute `{s}`: expected \"package\", \"fp32\" or \"bf16\""
            )))
        }
    })
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (path, function_name=None, compute="package", seed=0, max_memory=None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        function_name: Option<String>,
        compute: &str,
        seed: u64,
        max_memory: Option<u64>,
    ) -> PyResult<Model> {
        let opts = milkit::runtime::Options {
            max_memory: Some(max_memory.unwrap_or_else(milkit::runtime::default_max_memory)),
            seed,
            compute: self::compute(compute)?,
            ..Default::default()
        };
        let session = py
            .detach(|| {
                use anyhow::Context;
                Session::load_with(&path, &opts)
                    .with_context(|| format!("cannot load {}", path.display()))
            })
            .map_err(err)?;
        let functions: Vec<String> = session.functions().iter().map(|s| s.to_string()).collect();
        let function_run = match &function_name {
            Some(f) if !functions.contains(f) => {
                return Err(msg(format!(
                    "{}: no function `{f}` (have: {})",
                    path.display(),
                    functions.join(", ")
                )))
            }
            Some(f) => f.clone(),
            None => {
                let d = &session.description().default_function;
                if functions.contains(d) {
                    d.clone()
                } else if functions.iter().any(|f| f == "main") {
                    "main".into()
                } else {
                    functions.first().cloned().unwrap_or_default()
                }
            }
        };
        let states = session
            .state_names()
            .into_iter()
            .filter_map(|n| {
                session
                    .state(n)
                    .map(|t| (n.to_string(), (t.dtype(), t.dims().to_vec())))
            })
            .collect();
        Ok(Model {
            path,
            function: function_name,
            description: session.description().clone(),
            functions,
            function_run,
            states,
            session: Mutex::new(session),
        })
    }

    /// The package path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// The function given at load (`None`: the package's default).
    #[getter]
    fn function_name(&self) -> Option<String> {
        self.function.clone()
    }

    /// The function predictions run.
    #[getter]
    fn function(&self) -> String {
        self.function_run.clone()
    }

    /// Every function of the package, sorted.
    #[getter]
    fn function_names(&self) -> Vec<String> {
        self.functions.clone()
    }

    /// `(inputs, outputs, states)` of the function predictions run, each a list of dicts
    /// (name, type, dtype, shape, flexible, doc).
    fn describe<'py>(&self, py: Python<'py>) -> PyResult<(Dicts<'py>, Dicts<'py>, Dicts<'py>)> {
        let (i, o, s) = interface(&self.description, &self.function_run);
        let conv = |fs: &[Feature]| -> PyResult<Dicts<'py>> {
            fs.iter().map(|f| feature_dict(py, f)).collect()
        };
        let (mut i, mut o, mut s) = (conv(i)?, conv(o)?, conv(s)?);
        // A package without a description of its interface: the program's own.
        if i.is_empty() && o.is_empty() {
            let sess = lock(&self.session);
            let f = Some(self.function_run.as_str());
            let plain = |name: &str, t: &milkit::ir::ValueType| -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                d.set_item("name", name)?;
                d.set_item("type", "multiArray")?;
                d.set_item("dtype", py.None())?;
                d.set_item("shape", py.None())?;
                d.set_item("flexible", py.None())?;
                d.set_item("doc", t.to_string())?;
                Ok(d)
            };
            i = sess
                .inputs(f)
                .map_err(err)?
                .iter()
                .map(|(n, t)| plain(n, t))
                .collect::<PyResult<_>>()?;
            o = sess
                .outputs(f)
                .map_err(err)?
                .iter()
                .map(|(n, t)| plain(n, t))
                .collect::<PyResult<_>>()?;
        }
        if s.is_empty() {
            s = self
                .states
                .iter()
                .map(|(n, (dt, shape))| -> PyResult<_> {
                    let d = PyDict::new(py);
                    d.set_item("name", n)?;
                    d.set_item("type", "state")?;
                    d.set_item("dtype", format!("{dt:?}").to_lowercase())?;
                    d.set_item("shape", shape.clone())?;
                    d.set_item("flexible", py.None())?;
                    d.set_item("doc", "")?;
                    Ok(d)
                })
                .collect::<PyResult<_>>()?;
        }
        Ok((i, o, s))
    }

    /// A new set of states for this model, zeros.
    fn make_state(slf: &Bound<'_, Self>) -> State {
        let m = slf.borrow();
        State {
            owner: slf.as_ptr() as usize,
            types: m.states.clone(),
            values: Mutex::new(BTreeMap::new()),
        }
    }

    /// Runs the model on `inputs` (a dict name → numpy array); returns a dict name →
    /// output. With `state`, the model's states are read from it and written back to it;
    /// without, a stateful model starts from zeros.
    #[pyo3(signature = (inputs, state=None))]
    fn predict<'py>(
        slf: &Bound<'py, Self>,
        inputs: &Bound<'py, PyDict>,
        state: Option<PyRef<'py, State>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let py = slf.py();
        let me = slf.borrow();
        let mut feeds: Vec<(String, Tensor)> = Vec::with_capacity(inputs.len());
        for (k, v) in inputs.iter() {
            let name: String = k
                .extract()
                .map_err(|_| msg(format!("input names must be strings, got {k}")))?;
            let t = tensor_from_array(&name, &v)?;
            feeds.push((name, t));
        }
        let states: Vec<(String, Tensor)> = match &state {
            Some(s) => {
                if s.owner != slf.as_ptr() as usize {
                    return Err(msg(
                        "the state was made by another model (use this model's make_state())"
                            .into(),
                    ));
                }
                s.types
                    .keys()
                    .map(|n| Ok((n.clone(), s.value(n)?)))
                    .collect::<PyResult<_>>()?
            }
            None => vec![],
        };
        let function = me.function_run.clone();
        let path = me.path.clone();
        let session = &me.session;
        let with_state = state.is_some();
        let (outs, new_states) = py
            .detach(|| -> anyhow::Result<_> {
                let mut s = lock(session);
                if with_state {
                    for (n, t) in &states {
                        s.set_state(n, t.clone())?;
                    }
                } else {
                    s.reset_states()?;
                }
                let named: Vec<(&str, Tensor)> =
                    feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                let outs = s.predict_values(Some(&function), &named)?;
                let new_states: Vec<(String, Tensor)> = if with_state {
                    states
                        .iter()
                        .filter_map(|(n, _)| s.state(n).map(|t| (n.clone(), t)))
                        .collect()
                } else {
                    vec![]
                };
                drop(s);
                let outs = outs
                    .into_iter()
                    .map(|(n, v)| Ok((n.clone(), to_host(&n, v)?)))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Ok((outs, new_states))
            })
            .map_err(|e| err(e.context(format!("predicting with {}", path.display()))))?;
        if let Some(s) = &state {
            lock(&s.values).extend(new_states);
        }
        let d = PyDict::new(py);
        for (n, h) in outs {
            d.set_item(n, to_python(py, h)?)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "milkit.MLModel({:?}, function {:?})",
            self.path.display().to_string(),
            self.function_run
        )
    }
}

/// Runs the `milkit` command line: `argv` as `sys.argv` gives it (the program name first);
/// returns the exit status. Prints to the process's stdout and stderr.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| {
        // As the binary: a closed stdout ends the command quietly; one malloc arena.
        #[cfg(unix)]
        // SAFETY: SIG_DFL is always a valid disposition for SIGPIPE; the process is the
        // `milkit` command from here on.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
        milkit::alloc::one_arena();
        cli::main(argv)
    })
}

/// `milkit transcribe`'s arguments, parsed by the command line's own argument struct so that
/// the Python call has exactly its defaults and checks.
#[derive(clap::Parser)]
#[command(name = "milkit.transcribe", no_binary_name = true)]
struct TranscribeCall {
    #[command(flatten)]
    args: cli::transcribe::TranscribeArgs,
}

/// Transcribes one audio file with a models folder, as `milkit transcribe` does; `argv` the
/// options as that command's flags. Returns openai-whisper's result dict as JSON.
#[pyfunction]
fn transcribe_json(py: Python<'_>, argv: Vec<String>) -> PyResult<String> {
    use anyhow::Context;
    use clap::Parser;
    let call = TranscribeCall::try_parse_from(&argv).map_err(|e| msg(e.to_string()))?;
    let a = call.args;
    py.detach(|| -> anyhow::Result<String> {
        let open = milkit::transcribe::OpenOptions {
            mel_package: a.mel_package,
            compute: a.decode.compute,
            prefill: a.prefill,
        };
        let mut tr = milkit::transcribe::Transcriber::open_with(&a.models, &open)
            .with_context(|| format!("opening models folder {}", a.models.display()))?;
        let mut opts = a.decode.options(&a.models)?;
        opts.word_timestamps = a.word_timestamps;
        tr.check_options(&opts)
            .with_context(|| format!("models folder {}", a.models.display()))?;
        let [audio] = a.audio.as_slice() else {
            anyhow::bail!("one audio file per call, got {}", a.audio.len())
        };
        let mut vad = a.vad.load(a.decode.compute, false)?;
        let (samples, info) = milkit::whisper::audio::load_audio_info(audio)?;
        let mut r = cli::transcribe::transcribe_samples(&mut tr, &samples, &opts, vad.as_mut())
            .with_context(|| format!("transcribing {}", audio.display()))?;
        r.audio = Some(info);
        Ok(serde_json::to_string(&r.to_result(opts.word_timestamps))?)
    })
    .map_err(err)
}

/// `milkit verify`'s arguments, parsed by the library's own argument struct.
#[derive(clap::Parser)]
#[command(name = "milkit.verify", no_binary_name = true)]
struct VerifyCall {
    #[command(flatten)]
    args: milkit::verify::cli::VerifyArgs,
}

/// Verifies a package as `milkit verify --json` does; `argv` the package and that command's
/// flags. Returns the report as JSON (schemas/verify.schema.json); mismatches are in it
/// (`ok` false), an unreadable package is an error.
#[pyfunction]
fn verify_json(py: Python<'_>, argv: Vec<String>) -> PyResult<String> {
    use clap::Parser;
    let call = VerifyCall::try_parse_from(&argv).map_err(|e| msg(e.to_string()))?;
    let a = call.args;
    if a.measured {
        return Err(msg(
            "measured: Core ML's MLComputePlan is asked through xcrun by the `milkit verify \
             --measured` command (macOS)"
                .into(),
        ));
    }
    let command_line: Vec<String> = std::iter::once("milkit.verify".to_string())
        .chain(argv)
        .collect();
    py.detach(|| -> anyhow::Result<String> {
        let report = milkit::verify::cli::verify_package(&a.package, &a.options(), &command_line)
            .map_err(|e| e.context(format!("cannot verify {}", a.package.display())))?;
        Ok(serde_json::to_string(&report)?)
    })
    .map_err(err)
}

/// `milkit export`'s arguments, parsed by the command line's own argument struct so that the
/// Python call has exactly its defaults and checks.
#[derive(clap::Parser)]
#[command(name = "milkit.export", no_binary_name = true)]
struct ExportCall {
    #[command(flatten)]
    args: cli::export::ExportArgs,
}

/// Exports a checkpoint as `milkit export` does, in this process; `argv` that command's
/// flags. Progress and the report go to stderr (none with `--quiet`).
#[pyfunction]
fn export_run(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    use clap::Parser;
    let call = ExportCall::try_parse_from(&argv).map_err(|e| msg(e.to_string()))?;
    let a = call.args;
    match py.detach(|| cli::export::run(&a)).map_err(err)? {
        0 => Ok(()),
        status => Err(msg(format!(
            "export of {} ended with status {status}",
            a.out.display()
        ))),
    }
}

#[pymodule]
fn _milkit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<State>()?;
    m.add("MilkitError", m.py().get_type::<MilkitError>())?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(transcribe_json, m)?)?;
    m.add_function(wrap_pyfunction!(verify_json, m)?)?;
    m.add_function(wrap_pyfunction!(export_run, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
