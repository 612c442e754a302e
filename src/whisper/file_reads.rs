//! A per-thread tally of the checkpoint files milkit's readers parse (`config.json`,
//! `generation_config.json`, `tokenizer.json`, `preprocessor_config.json`, the weights),
//! by file name. It makes "a checkpoint is opened once" observable: a test exports through a
//! [`super::checkpoint::Checkpoint`] and checks that no file was read twice. Per thread, so
//! tests running side by side do not count each other's reads.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;

thread_local! {
    static READS: RefCell<BTreeMap<String, usize>> = const { RefCell::new(BTreeMap::new()) };
}

/// Counts one read of `path` (by its file name) on this thread.
pub fn note(path: &Path) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    READS.with(|r| *r.borrow_mut().entry(name).or_default() += 1);
}

/// The reads counted on this thread since the last call (file name → count); resets them.
pub fn take() -> BTreeMap<String, usize> {
    READS.with(|r| std::mem::take(&mut *r.borrow_mut()))
}
