//! Conversion of a compression pass outcome into its report.

use crate::passes::compress::{Outcome, KEPT_FP16_REASON};
use crate::report::{CompressReport, CompressedOp, SkippedOp};

impl CompressReport {
    pub fn from_outcome(o: &Outcome, mode: &str) -> CompressReport {
        let before: u64 = o.compressed.iter().map(|c| c.bytes_before).sum();
        let after: u64 = o.compressed.iter().map(|c| c.bytes_after).sum();
        let n = o.compressed.len().max(1) as f64;
        CompressReport {
            mode: mode.to_string(),
            ops: o
                .compressed
                .iter()
                .map(|c| CompressedOp {
                    op: c.op.clone(),
                    op_type: c.op_type.clone(),
                    weight: c.weight.clone(),
                    shape: c.shape.clone(),
                    mode: c.mode.clone(),
                    bytes_before: c.bytes_before,
                    bytes_after: c.bytes_after,
                    rel_rms_error: c.rel_rms_error,
                })
                .collect(),
            skipped: o
                .skipped
                .iter()
                .map(|s| SkippedOp {
                    op: s.op.clone(),
                    weight: s.weight.clone(),
                    shape: s.shape.clone(),
                    reason: s.reason.clone(),
                })
                .collect(),
            regrouped: o.regrouped.clone(),
            bytes_before: before,
            bytes_after: after,
            ratio: if after > 0 {
                before as f64 / after as f64
            } else {
                0.0
            },
            mean_rel_rms_error: o.compressed.iter().map(|c| c.rel_rms_error).sum::<f64>() / n,
        }
    }

    /// Stored bits per compressed element: 8 × stored bytes ÷ the elements they decompress
    /// to (tables and scales included); `None` when nothing was compressed.
    pub fn bits_per_weight(&self) -> Option<f64> {
        let elements: u64 = self
            .ops
            .iter()
            .map(|c| c.shape.iter().product::<usize>() as u64)
            .sum();
        (elements > 0).then(|| 8.0 * self.bytes_after as f64 / elements as f64)
    }

    /// One line for people: how many weights, the method, bits, bytes before and after, the
    /// mean error, and what was skipped or reordered; `to_text` lists every weight.
    pub fn summary(&self) -> String {
        let mut s = format!("{} weights {}", self.ops.len(), self.mode);
        if let Some(b) = self.bits_per_weight() {
            s += &format!(" at {b:.3} bits");
        }
        s += &format!(
            ", {:.2} MB → {:.2} MB ({:.2}x), mean relative RMS error {:.4}",
            self.bytes_before as f64 / 1e6,
            self.bytes_after as f64 / 1e6,
            self.ratio,
            self.mean_rel_rms_error
        );
        let kept = self
            .skipped
            .iter()
            .filter(|k| k.reason == KEPT_FP16_REASON)
            .count();
        if kept > 0 {
            s += &format!(", {kept} kept fp16 by the plan");
        }
        if self.skipped.len() > kept {
            s += &format!(", {} skipped", self.skipped.len() - kept);
        }
        if !self.regrouped.is_empty() {
            s += &format!(", {} chains reordered", self.regrouped.len());
        }
        s
    }

    /// A human-readable table.
    pub fn to_text(&self) -> String {
        let mut s = format!("compressed {} weights ({}):\n", self.ops.len(), self.mode);
        for c in &self.ops {
            s += &format!(
                "  {:<40} {:>16} {:>10} → {:>9} B  rel.rms {:.4}\n",
                c.weight,
                format!("{:?}", c.shape),
                c.bytes_before,
                c.bytes_after,
                c.rel_rms_error
            );
        }
        for r in &self.regrouped {
            s += &format!(
                "  reordered {} of {} hidden channels: rows of {} / columns of {} (through {})\n",
                r.moved, r.channels, r.producer_weight, r.consumer_weight, r.activation
            );
        }
        for k in &self.skipped {
            s += &format!("  skipped {} {:?}: {}\n", k.weight, k.shape, k.reason);
        }
        s += &format!(
            "total {} → {} bytes ({:.2}x), mean relative RMS error {:.4}\n",
            self.bytes_before, self.bytes_after, self.ratio, self.mean_rel_rms_error
        );
        s
    }
}
