//! `milkit inspect`: what a package holds.

use anyhow::Result;
use clap::Args;
use milkit::package::load_package;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct InspectArgs {
    /// The .mlpackage to read.
    pub package: PathBuf,
    /// Print a JSON report (schema: schemas/inspect.schema.json).
    #[arg(long)]
    pub json: bool,
    /// Print the program as MIL text.
    #[arg(long)]
    pub mil: bool,
}

pub fn run(a: &InspectArgs) -> Result<u8> {
    let m = load_package(&a.package)?;
    println!("{}: spec {}", a.package.display(), m.spec_version);
    for f in &m.description.inputs {
        println!("  input  {} {:?} {:?}", f.name, f.dtype, f.shape);
    }
    for f in &m.description.outputs {
        println!("  output {} {:?} {:?}", f.name, f.dtype, f.shape);
    }
    for (name, f) in &m.program.functions {
        let mut h = BTreeMap::new();
        for op in f.block.walk() {
            *h.entry(op.op_type.as_str()).or_insert(0) += 1;
        }
        println!("  function {name} ({}):", f.opset.opset_name());
        for (k, v) in h {
            println!("    {k:<32} {v}");
        }
    }
    Ok(0)
}
