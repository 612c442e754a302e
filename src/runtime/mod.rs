//! milkit's MIL interpreter: runs any `.mlpackage` milkit can load on CPU. A [`Session`]
//! compiles each function once (constants converted and `constexpr_*` weights decoded at
//! load, see [`plan`]), binds inputs with Core ML's boundary conversions, walks the block
//! calling each op's `OpDef::eval`, frees every value after its last use, and keeps Core ML
//! states (zero-initialised) across calls. Uses `ir`, `ops`, `kernels` and `package`.

pub mod blend_fusion;
pub mod conv_fusion;
pub mod fusion;
pub mod io;
pub mod memo;
pub mod pack;
pub mod plan;
pub mod precision;
pub mod state_fusion;
pub mod step;

use crate::ir::{Description, Feature, FeatureKind, Model, ValueType};
use crate::kernels;
use crate::ops::eval::{storage_dtype, ExecEnv, StateCell};
use crate::ops::RValue;
pub use crate::ops::{DictKeys, DictVal};
use anyhow::{anyhow, bail, ensure, Context, Result};
pub use candle_core::{DType, Tensor};
use plan::{
    compile, is_run_time_sized, make_cx, op_label, run_eval, rvalue_bytes, zero_state, Plan, Src,
    CAPTURED,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a session compiles its program.
#[derive(Clone, Debug)]
pub struct Options {
    /// Fuse `matmul → [add] → softmax → matmul` attention chains (see [`fusion`]).
    pub fuse_attention: bool,
    /// Update states in place where a `read_state → slice_update → write_state` chain
    /// allows it (see [`state_fusion`]).
    pub fuse_state_updates: bool,
    /// Merge `add(mul(a, b), mul(c, d))` into one pass (see [`blend_fusion`]).
    pub fuse_blends: bool,
    /// Run a `gelu` reading a `conv`'s only result in the conv's store (see
    /// [`conv_fusion`]).
    pub fuse_conv_gelu: bool,
    /// Refuse, at load, a program whose constants plus the values live at once during a run
    /// would take more than this many bytes (every value of fixed type counted at its
    /// storage size; see [`plan::check_memory`]), instead of letting an allocation fail;
    /// values whose shape is known only at run time are counted as they are produced, and
    /// a run that goes over fails naming the op ([`plan::Budget::check_run`]).
    /// `None`: no cap. The default is [`default_max_memory`].
    pub max_memory: Option<u64>,
    /// The precision floating-point tensors are computed in (see [`precision`]).
    pub compute: precision::Compute,
    /// The most iterations one `while_loop` runs before the call fails naming it (a loop
    /// whose condition never turns false then ends in bounded time).
    pub max_loop_iterations: u64,
    /// The seed of the session's random stream, which the random ops without a `seed` of
    /// their own draw from (`milkit run --seed`); fixed by default, so runs reproduce.
    pub seed: u64,
}

/// The default bound on one `while_loop`'s iterations.
pub const DEFAULT_MAX_LOOP_ITERATIONS: u64 = 1_000_000;

/// The default memory cap of a session: the machine's physical memory (16 GiB where it
/// cannot be read).
pub fn default_max_memory() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads system configuration values.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && size > 0 {
            return (pages as u64).saturating_mul(size as u64);
        }
    }
    16 << 30
}

impl Default for Options {
    fn default() -> Options {
        Options {
            fuse_attention: true,
            fuse_state_updates: true,
            fuse_blends: true,
            fuse_conv_gelu: true,
            max_memory: Some(default_max_memory()),
            compute: precision::Compute::Package,
            max_loop_iterations: DEFAULT_MAX_LOOP_ITERATIONS,
            seed: 0,
        }
    }
}

/// One output of a prediction.
#[derive(Clone, Debug)]
pub enum Output {
    /// A numeric tensor.
    Tensor(Tensor),
    /// A string tensor, flattened (a classifier's string label is one string).
    Strings(Vec<String>),
    /// A dictionary (a classifier's class → probability).
    Dict(DictVal),
}

impl Output {
    /// `a tensor`, `strings`, `a dictionary`.
    pub fn kind(&self) -> &'static str {
        match self {
            Output::Tensor(_) => "a tensor",
            Output::Strings(_) => "strings",
            Output::Dict(_) => "a dictionary",
        }
    }
}

/// Profile entries: calls and total time per key (op type, or op).
type Times = BTreeMap<String, (usize, Duration)>;

/// A loaded program ready to run.
pub struct Session {
    description: Description,
    functions: BTreeMap<String, Plan>,
    default_function: String,
    states: BTreeMap<String, (ValueType, StateCell)>,
    profile: Option<Times>,
    /// Profile entries per op (`op_type name`) instead of per op type.
    profile_ops: bool,
    /// Per function: input-invariant values kept across calls (see [`memo`]); `None`
    /// when memoization is off.
    memo: Option<BTreeMap<String, memo::Memo>>,
    /// Limits and the random stream the ops that need the interpreter read.
    run: RunLimits,
}

/// What a run hands ops through [`ExecEnv`]: what products multiply, the loop bound, the
/// memory cap and the session's random stream (a counter advanced once per seed drawn).
struct RunLimits {
    products: kernels::gemm::Inputs,
    max_iterations: u64,
    max_memory: u64,
    seed: u64,
    draws: AtomicU64,
}

/// The environment of one step: its compiled blocks and the outer values they read.
struct Env<'a> {
    run: &'a RunLimits,
    blocks: &'a [Plan],
    captured: Vec<RValue>,
}

impl ExecEnv for Env<'_> {
    fn run_block(&self, block: usize, inputs: Vec<RValue>) -> Result<Vec<RValue>> {
        let plan = self
            .blocks
            .get(block)
            .ok_or_else(|| anyhow!("the op has no block {block}"))?;
        ensure!(
            inputs.len() + self.captured.len() == plan.inputs.len(),
            "block {block} takes {} inputs, got {}",
            plan.inputs.len() - self.captured.len(),
            inputs.len()
        );
        let mut slots: Vec<Option<RValue>> = vec![None; plan.nslots];
        for (i, v) in inputs
            .into_iter()
            .chain(self.captured.iter().cloned())
            .enumerate()
        {
            slots[plan.inputs[i].slot] = Some(v);
        }
        run_steps(plan, &mut slots, None, None, self.run)?;
        plan.outputs
            .iter()
            .map(|(name, src, _)| match *src {
                Src::Slot(k) => slots[k]
                    .clone()
                    .ok_or_else(|| anyhow!("block output `{name}` was not computed")),
                Src::Const(k) => Ok(plan.consts[k].val.clone()),
            })
            .collect()
    }
    fn max_iterations(&self) -> u64 {
        self.run.max_iterations
    }
    fn max_memory(&self) -> u64 {
        self.run.max_memory
    }
    fn products(&self) -> kernels::gemm::Inputs {
        self.run.products
    }
    fn next_seed(&self) -> u64 {
        let k = self.run.draws.fetch_add(1, Ordering::Relaxed);
        // splitmix64 of (seed, k): distinct, well-mixed seeds along the stream.
        let mut z = self
            .run
            .seed
            .wrapping_mul(0xD1B5_4A32_D192_ED03)
            .wrapping_add(k.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Session {
    /// Loads and checks an `.mlpackage`, then compiles it.
    pub fn load(path: &Path) -> Result<Session> {
        Session::load_with(path, &Options::default())
    }

    pub fn load_with(path: &Path, opts: &Options) -> Result<Session> {
        let m = crate::package::load_package(path)?;
        Session::from_model_with(m, opts)
            .with_context(|| format!("preparing {} to run", path.display()))
    }

    /// Compiles every function of a model.
    pub fn from_model(m: Model) -> Result<Session> {
        Session::from_model_with(m, &Options::default())
    }

    pub fn from_model_with(mut m: Model, opts: &Options) -> Result<Session> {
        opts.compute.require(kernels::gemm::bf16_cpu())?;
        if opts.compute == precision::Compute::Fp32 {
            precision::promote_fp16(&mut m)?;
        }
        let mut functions = BTreeMap::new();
        let mut states: BTreeMap<String, (ValueType, StateCell)> = BTreeMap::new();
        for (name, f) in &m.program.functions {
            let plan = compile(f, opts).with_context(|| format!("function `{name}`"))?;
            for i in plan
                .inputs
                .iter()
                .filter(|i| matches!(i.ty, ValueType::State(_)))
            {
                match states.get(&i.name) {
                    Some((t, _)) => ensure!(
                        *t == i.ty,
                        "state `{}` is {} in one function and {t} in another",
                        i.name,
                        i.ty
                    ),
                    None => {
                        let z = zero_state(&i.name, &i.ty)?;
                        states.insert(i.name.clone(), (i.ty.clone(), StateCell::new(z)));
                    }
                }
            }
            functions.insert(name.clone(), plan);
        }
        let described = &m.description.default_function;
        let default_function = if functions.contains_key(described) {
            described.clone()
        } else if functions.contains_key("main") {
            "main".to_string()
        } else {
            functions
                .keys()
                .next()
                .cloned()
                .ok_or_else(|| anyhow!("the program has no functions"))?
        };
        Ok(Session {
            description: m.description,
            functions,
            default_function,
            states,
            profile: None,
            profile_ops: false,
            memo: Some(BTreeMap::new()),
            run: RunLimits {
                products: opts.compute.products(),
                max_iterations: opts.max_loop_iterations,
                max_memory: opts.max_memory.unwrap_or(u64::MAX),
                seed: opts.seed,
                draws: AtomicU64::new(0),
            },
        })
    }

    pub fn description(&self) -> &Description {
        &self.description
    }

    /// Function names, sorted.
    pub fn functions(&self) -> Vec<&str> {
        self.functions.keys().map(|s| s.as_str()).collect()
    }

    /// The caller-fed inputs of a function (states excluded) with their types.
    pub fn inputs(&self, function: Option<&str>) -> Result<Vec<(String, ValueType)>> {
        let p = self.plan(function)?;
        Ok(p.inputs
            .iter()
            .filter(|i| !matches!(i.ty, ValueType::State(_)))
            .map(|i| (i.name.clone(), i.ty.clone()))
            .collect())
    }

    /// The outputs of a function with their types.
    pub fn outputs(&self, function: Option<&str>) -> Result<Vec<(String, ValueType)>> {
        Ok(self
            .plan(function)?
            .outputs
            .iter()
            .map(|(n, _, t)| (n.clone(), t.clone()))
            .collect())
    }

    fn plan(&self, function: Option<&str>) -> Result<&Plan> {
        let name = function.unwrap_or(&self.default_function);
        self.functions.get(name).ok_or_else(|| {
            anyhow!(
                "no function `{name}` (have: {})",
                self.functions().join(", ")
            )
        })
    }

    /// Names of the states the session holds (one per package, shared by its functions).
    pub fn state_names(&self) -> Vec<&str> {
        self.states.keys().map(|s| s.as_str()).collect()
    }

    /// Current value of a state.
    pub fn state(&self, name: &str) -> Option<Tensor> {
        self.states.get(name).map(|(_, c)| c.get())
    }

    /// Replaces a state's value (converted to its dtype; the shape must match).
    pub fn set_state(&mut self, name: &str, value: Tensor) -> Result<()> {
        let (ty, cell) = self
            .states
            .get(name)
            .ok_or_else(|| anyhow!("no state `{name}`"))?;
        let ValueType::State(t) = ty else {
            bail!("`{name}` is not a state")
        };
        cell.set(conform(name, &ValueType::Tensor(t.clone()), value)?);
        Ok(())
    }

    /// Sets every state back to zeros.
    pub fn reset_states(&mut self) -> Result<()> {
        for (name, (ty, cell)) in &self.states {
            cell.set(zero_state(name, ty)?);
        }
        Ok(())
    }

    /// Turns reuse of input-invariant values across calls on (the default) or off.
    pub fn set_memoize(&mut self, on: bool) {
        self.memo = on.then(BTreeMap::new);
    }

    /// Values currently kept by memoization (all functions).
    pub fn memoized_values(&self) -> usize {
        self.memo.iter().flatten().map(|(_, m)| m.cached()).sum()
    }

    /// Bytes of constant weights one run of `function` reads in its contractions (packed
    /// weights at their stored size; see [`pack::streamed_bytes`]).
    pub fn streamed_bytes(&self, function: Option<&str>) -> Result<usize> {
        let p = self.plan(function)?;
        Ok(pack::streamed_bytes(&p.consts, &p.steps))
    }

    /// Starts (or stops) accumulating time per op type; see [`Session::profile`].
    pub fn enable_profiling(&mut self, on: bool) {
        self.profile = on.then(BTreeMap::new);
    }

    /// Keys [`Session::profile`]'s entries by each op (`op_type name`, the op's output name
    /// in the program) instead of by op type.
    pub fn profile_each_op(&mut self, each: bool) {
        self.profile_ops = each;
    }

    /// (op type, or `op_type name` with [`Session::profile_each_op`], calls, total time)
    /// since profiling was enabled, slowest first.
    pub fn profile(&self) -> Vec<(String, usize, Duration)> {
        let mut v: Vec<_> = self
            .profile
            .iter()
            .flatten()
            .map(|(k, (n, d))| (k.clone(), *n, *d))
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.2));
        v
    }

    /// Runs the default function (`main`).
    pub fn predict(&mut self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        self.predict_function(None, inputs)
    }

    /// Runs `function` (None: `main`) on named inputs; returns the outputs in block order.
    /// Every output must be a numeric tensor; [`Session::predict_values`] also returns a
    /// classifier's label and dictionary.
    pub fn predict_function(
        &mut self,
        function: Option<&str>,
        inputs: &[(&str, Tensor)],
    ) -> Result<Vec<(String, Tensor)>> {
        self.predict_values(function, inputs)?
            .into_iter()
            .map(|(name, v)| match v {
                Output::Tensor(t) => Ok((name, t)),
                o => bail!(
                    "output `{name}` is {}, not a tensor (read it with predict_values)",
                    o.kind()
                ),
            })
            .collect()
    }

    /// Runs `function` (None: `main`) on named inputs; returns every output in block order:
    /// tensors (in the description's dtype), string tensors and dictionaries.
    pub fn predict_values(
        &mut self,
        function: Option<&str>,
        inputs: &[(&str, Tensor)],
    ) -> Result<Vec<(String, Output)>> {
        let fname = function.unwrap_or(&self.default_function).to_string();
        // Field-level borrows: the plan is read while the profile is updated.
        let plan = self
            .functions
            .get(&fname)
            .ok_or_else(|| anyhow!("no function `{fname}`"))?;
        let mut slots: Vec<Option<RValue>> = vec![None; plan.nslots];
        let fed: Vec<&str> = plan
            .inputs
            .iter()
            .filter(|i| !matches!(i.ty, ValueType::State(_)))
            .map(|i| i.name.as_str())
            .collect();
        for (n, _) in inputs {
            ensure!(
                fed.contains(n),
                "unknown input `{n}` for function `{fname}` (expects: {})",
                fed.join(", ")
            );
        }
        for i in &plan.inputs {
            if let ValueType::State(_) = i.ty {
                let (_, cell) = self
                    .states
                    .get(&i.name)
                    .ok_or_else(|| anyhow!("state `{}` is not held by the session", i.name))?;
                slots[i.slot] = Some(RValue::State(cell.clone()));
                continue;
            }
            let mut given = inputs.iter().filter(|(n, _)| *n == i.name);
            let (_, t) = given.next().ok_or_else(|| {
                anyhow!(
                    "missing input `{}` ({}) for function `{fname}`",
                    i.name,
                    i.ty
                )
            })?;
            ensure!(given.next().is_none(), "input `{}` given twice", i.name);
            // The description says which shapes the model accepts (its default shape, or
            // those its flexibility allows); the program's `?` dimensions accept any.
            let mut t = t.clone();
            if let Some(f) = described(&self.description, &fname, false)
                .iter()
                .find(|f| f.name == i.name)
            {
                match f.kind {
                    FeatureKind::Image(c) => t = image_input(f, c, &i.ty, t)?,
                    _ => {
                        // A 0-d scalar for an input of one element takes its shape.
                        if t.rank() == 0 && f.shape.iter().product::<usize>() == 1 {
                            t = t.reshape(f.shape.as_slice())?;
                        }
                        f.check_shape(t.dims()).map_err(|e| anyhow!(e))?
                    }
                }
            }
            slots[i.slot] = Some(RValue::T(conform(&i.name, &i.ty, t)?));
        }
        let mut profile = self.profile.take();
        let memo = match self.memo.as_mut() {
            Some(m) => {
                if !m.contains_key(&fname) {
                    if let Some(new) = memo::Memo::new(plan) {
                        m.insert(fname.clone(), new);
                    }
                }
                m.get_mut(&fname)
            }
            None => None,
        };
        // The whole call runs on a pool worker: each op's parallel loop then forks from
        // inside the pool (work stealing from a thread that is already awake) instead of
        // injecting its jobs from outside and blocking on a latch, a wake-up per op that
        // costs about as much as a decode step's small GEMVs themselves. A helper job keeps
        // the other workers awake for the call (see `keep_awake`).
        let run = &self.run;
        let profile_ops = self.profile_ops;
        let res = on_awake_pool(|| {
            let profile = profile.as_mut().map(|p| (p, profile_ops));
            run_steps(plan, &mut slots, profile, memo, run)
        });
        self.profile = profile;
        res?;
        let mut out = Vec::new();
        for (name, src, _) in &plan.outputs {
            let v = match *src {
                Src::Slot(k) => slots[k]
                    .clone()
                    .ok_or_else(|| anyhow!("output `{name}` was not computed"))?,
                Src::Const(k) => plan.consts[k].val.clone(),
            };
            let v = match v {
                RValue::T(mut t) => {
                    // The model description is the ABI: hand back its dtype if it differs.
                    if let Some(f) = described(&self.description, &fname, true)
                        .iter()
                        .find(|f| f.name == *name && f.kind == FeatureKind::Array)
                    {
                        t = kernels::cast(&t, storage_dtype(f.dtype.to_dtype())?)?;
                    }
                    Output::Tensor(t)
                }
                RValue::Str(s) => Output::Strings(s),
                RValue::Dict(d) => Output::Dict(d),
                RValue::State(_) | RValue::List(_) => {
                    bail!("output `{name}` is a state or a list, which a prediction cannot return")
                }
            };
            out.push((name.clone(), v));
        }
        Ok(out)
    }
}

/// A function's described inputs (or outputs): a multifunction model's per-function
/// interface, else the top-level one.
fn described<'d>(d: &'d Description, function: &str, outputs: bool) -> &'d [Feature] {
    match (d.functions.get(function), outputs) {
        (Some(io), false) => &io.inputs,
        (Some(io), true) => &io.outputs,
        (None, false) => &d.inputs,
        (None, true) => &d.outputs,
    }
}

/// Runs `f` on a pool worker with the other workers kept awake meanwhile (see
/// `keep_awake`): for a caller that runs many calls with little work between them (a
/// decoding loop), so each call finds the pool awake.
pub fn on_awake_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let done = std::sync::atomic::AtomicBool::new(false);
    // A call from outside the pool is one caller more until it returns (a call nested in a
    // pool job runs inside its caller's).
    let _caller = rayon::current_thread_index()
        .is_none()
        .then(CallerCount::enter);
    rayon::scope(|s| {
        keep_awake(s, &done);
        let _stop = StopOnDrop(&done);
        f()
    })
}

/// Spawns, for a pool of more than one thread, a job that takes pending pool work as soon
/// as it appears until `done`: a worker that slept between two ops (a decode step's ops
/// are tens of microseconds apart, longer than rayon spins before sleeping) needs about as
/// long to wake as a small GEMV takes, and the caller's thread did that GEMV's share alone
/// meanwhile (measured: 24 fp16 384×384 GEMVs 0.92 → 0.33 ms with 100 µs between them).
/// The job does nothing when it lands on the caller's own thread: it would spin on top of
/// the frame that sets `done`; and it ends as soon as another thread calls too, whose call
/// needs the worker. It also gives up after [`MAX_IDLE`] without pool work: a
/// worker that stole it while waiting inside another call (sessions run from parallel
/// tasks) holds that call up for at most that long, and two such calls cannot wait on
/// each other's helpers for ever.
fn keep_awake<'s>(s: &rayon::Scope<'s>, done: &'s std::sync::atomic::AtomicBool) {
    if rayon::current_num_threads() < 2 {
        return;
    }
    let caller = rayon::current_thread_index();
    s.spawn(move |_| {
        if rayon::current_thread_index() == caller {
            return;
        }
        let mut last_work = Instant::now();
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            if CALLERS.load(std::sync::atomic::Ordering::Acquire) > 1 {
                // Other threads' calls wait for this worker: taking one of them here would
                // hold this call up until that one ends, and they keep the pool busy anyway.
                return;
            }
            if matches!(rayon::yield_now(), Some(rayon::Yield::Executed)) {
                last_work = Instant::now();
            } else if last_work.elapsed() > MAX_IDLE {
                return;
            } else {
                std::hint::spin_loop();
            }
        }
    });
}

/// How long `keep_awake`'s helper waits for pool work before it gives up: longer than any
/// gap between two parallel ops of a decode step (an attention or a state update, well
/// under a millisecond), short against a call that runs single-threaded for long.
const MAX_IDLE: Duration = Duration::from_millis(2);

/// Calls of [`on_awake_pool`] from outside the pool now running (threads predicting at once).
static CALLERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One caller counted in [`CALLERS`] while it lives.
struct CallerCount;

impl CallerCount {
    fn enter() -> CallerCount {
        CALLERS.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        CallerCount
    }
}

impl Drop for CallerCount {
    fn drop(&mut self) {
        CALLERS.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Sets the flag when dropped, so `keep_awake`'s job ends even when the run panics.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

fn run_steps(
    plan: &Plan,
    slots: &mut [Option<RValue>],
    mut profile: Option<(&mut Times, bool)>,
    mut memo: Option<&mut memo::Memo>,
    run: &RunLimits,
) -> Result<()> {
    let cp = memo.as_mut().map(|m| m.begin(plan, slots));
    // Values of run-time shape (counted 0 at load): their real bytes per slot, and the sum
    // of those live, checked against the cap as each is produced.
    let mut dyn_bytes = vec![0u64; slots.len()];
    let mut dyn_live = 0u64;
    for i in plan.inputs.iter().filter(|i| is_run_time_sized(&i.ty)) {
        if let Some(v) = &slots[i.slot] {
            dyn_bytes[i.slot] = rvalue_bytes(v);
            dyn_live = dyn_live.saturating_add(dyn_bytes[i.slot]);
        }
    }
    let free = |st: &plan::Step, slots: &mut [Option<RValue>], dyn_bytes: &mut [u64]| {
        let mut freed = 0u64;
        for k in &st.free {
            slots[*k] = None;
            freed = freed.saturating_add(std::mem::take(&mut dyn_bytes[*k]));
        }
        freed
    };
    for (si, st) in plan.steps.iter().enumerate() {
        if let (Some(m), Some(cp)) = (memo.as_ref(), cp.as_ref()) {
            if !cp.run[si] {
                m.restore(plan, si, cp, slots);
                dyn_live = dyn_live.saturating_sub(free(st, slots, &mut dyn_bytes));
                continue;
            }
        }
        let t0 = Instant::now();
        let outs = {
            let env = Env {
                run,
                blocks: &st.blocks,
                captured: captured(st, slots)?,
            };
            let mut cx = make_cx(st, plan.opset, &plan.consts, slots)?;
            cx.env = Some(&env);
            run_eval(st.eval, &cx).with_context(|| op_label(&st.op_type, &st.name, plan.opset))?
        };
        let mut produced = 0u64;
        for ((k, v), ty) in st.outs.iter().zip(outs).zip(&st.out_types) {
            if is_run_time_sized(ty) {
                let b = rvalue_bytes(&v);
                produced = produced.saturating_add(b);
                dyn_bytes[*k] = b;
            }
            slots[*k] = Some(v);
        }
        if produced > 0 {
            dyn_live = dyn_live.saturating_add(produced);
            plan.budget.check_run(st, si, dyn_live, produced)?;
        }
        if let Some(m) = memo.as_mut() {
            m.store(plan, si, slots);
        }
        dyn_live = dyn_live.saturating_sub(free(st, slots, &mut dyn_bytes));
        if let Some((p, each)) = profile.as_mut() {
            let key = match each {
                true => format!("{} {}", st.op_type, st.name),
                false => st.op_type.clone(),
            };
            let e = p.entry(key).or_default();
            e.0 += 1;
            e.1 += t0.elapsed();
        }
    }
    Ok(())
}

/// The outer values a step's nested blocks read (bound as [`CAPTURED`]).
fn captured(st: &plan::Step, slots: &[Option<RValue>]) -> Result<Vec<RValue>> {
    if st.blocks.is_empty() {
        return Ok(vec![]);
    }
    st.args
        .iter()
        .filter(|(p, _)| p == CAPTURED)
        .flat_map(|(_, v)| v)
        .map(|s| match *s {
            Src::Slot(k) => slots[k].clone().ok_or_else(|| {
                anyhow!(
                    "an outer value of `{}` was freed (interpreter bug)",
                    st.name
                )
            }),
            Src::Const(_) => bail!(
                "`{}` binds a constant as an outer value (interpreter bug)",
                st.name
            ),
        })
        .collect()
}

/// An image input's pixels as the tensor its program input takes, as Core ML turns a pixel
/// buffer into one: `[H, W]` (grayscale) or `[H, W, 3|4]` (red, green, blue, and alpha,
/// which is dropped) becomes `[1, C, H, W]` (or `[C, H, W]`) in the feature's channel order
/// (BGR reverses the three), as floats holding the pixel values; the program itself scales
/// and biases them. A tensor already of the program input's rank passes as it is. The
/// image size must be one the feature accepts.
fn image_input(
    f: &Feature,
    color: crate::ir::ColorSpace,
    ty: &ValueType,
    t: Tensor,
) -> Result<Tensor> {
    let rank = ty.as_tensor().map_or(4, |t| t.rank());
    let dims = t.dims().to_vec();
    let want_c = color.channels();
    let bad = || {
        anyhow!(
            "input `{}` is a {} image: expected pixels [H, W{}] or a tensor of rank {rank}, got shape {dims:?}",
            f.name,
            color.name(),
            if want_c == 1 { "" } else { ", 3" },
        )
    };
    if dims.len() == rank {
        f.check_shape(&dims[rank - 2..]).map_err(|e| anyhow!(e))?;
        return Ok(t);
    }
    let (h, w, c) = match dims[..] {
        [h, w] => (h, w, 1),
        [h, w, c] => (h, w, c),
        _ => return Err(bad()),
    };
    let c_used = match (want_c, c) {
        (1, 1) => 1,
        (3, 3 | 4) => 3,
        _ => return Err(bad()),
    };
    f.check_shape(&[h, w]).map_err(|e| anyhow!(e))?;
    let t = kernels::cast(&t, DType::F32)?.reshape((h, w, c))?;
    let mut t = t.narrow(2, 0, c_used)?.permute((2, 0, 1))?.contiguous()?;
    if color == crate::ir::ColorSpace::Bgr {
        let order = Tensor::new(&[2u32, 1, 0], t.device())?;
        t = t.index_select(&order, 0)?;
    }
    Ok(if rank == 4 { t.unsqueeze(0)? } else { t })
}

/// Converts a caller's tensor to an input's type as Core ML does at its boundary: any
/// float or integer tensor to a float input (fp32 data for fp16 inputs, an int32 mask for
/// an fp16 mask), any float or integer tensor to an integer input (floats truncated toward
/// zero, as coremltools' own harness relies on when it hands every input over as fp32);
/// the shape must match every fixed dimension.
fn conform(name: &str, ty: &ValueType, t: Tensor) -> Result<Tensor> {
    let tt = ty
        .as_tensor()
        .ok_or_else(|| anyhow!("input `{name}` has the non-tensor type {ty}"))?;
    ensure!(
        t.rank() == tt.rank(),
        "input `{name}`: expected {tt}, got shape {:?}",
        t.dims()
    );
    for (d, w) in t.dims().iter().zip(&tt.shape) {
        if let crate::ir::Dim::Fixed(w) = w {
            ensure!(
                d == w,
                "input `{name}`: expected {tt}, got shape {:?}",
                t.dims()
            );
        }
    }
    let want = storage_dtype(tt.dtype)?;
    if t.dtype() == want {
        return Ok(t);
    }
    if tt.dtype == crate::ir::DType::Bool {
        let zero = kernels::index::full(&[], 0.0, t.dtype())?;
        return kernels::compare(&t, &zero, kernels::CmpOp::Ne);
    }
    kernels::cast(&t, want)
}
