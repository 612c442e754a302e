//! `non_maximum_suppression`: iOS15 (boxes `[n, B, 4]`, scores `[n, B, K]`, a
//! `score_threshold`, four outputs with the count per batch) and iOS17 (boxes `[n, 4, B]`,
//! scores `[n, K, B]`, no threshold, three outputs), as coremltools 9's numpy reference
//! (`ops/tests/iOS14/test_tensor_operation.py`, TF's greedy NMS) computes it: boxes are
//! `(x, y, width, height)` centres; a box's score is its best class score; boxes are taken
//! in descending score (stable), those scoring ≤ `score_threshold` never, a box is dropped
//! when its IoU with an already kept one exceeds `iou_threshold` (per class of its best
//! score with `per_class_suppression`, then merged in score order); at most `max_boxes`;
//! when none survives the best-scoring box alone is kept. Unused rows are zero, indices −1.
//! Quadratic in the kept boxes only (each candidate against the ≤ `max_boxes` kept).

use super::eval::{EvalCx, RValue};
use super::infer::{float_only, tensor, InferCx};
use super::DefaultValue;
use super::{opt_c, req, req_c, ver as v, InputSpec, OpDef};
use crate::ir::{DType, Dim, Opset, ValueType};
use crate::kernels;
use anyhow::{bail, ensure, Result};

/// iOS17's layout puts the box axis last.
fn boxes_last(cx_opset: Opset) -> bool {
    cx_opset >= Opset::Ios17
}

fn infer_nms(cx: &InferCx) -> Result<Vec<ValueType>> {
    let (b, s) = (cx.t("boxes")?, cx.t("scores")?);
    float_only(b, "boxes")?;
    float_only(s, "scores")?;
    ensure!(
        b.rank() == 3 && s.rank() == 3,
        "`non_maximum_suppression`: boxes {b} and scores {s} must be rank 3"
    );
    let last = boxes_last(cx.opset);
    let (coord_axis, box_axis) = if last { (1, 2) } else { (2, 1) };
    ensure!(
        b.shape[coord_axis] == Dim::Fixed(4),
        "`non_maximum_suppression` in {}: boxes {b} must be {}",
        cx.opset.opset_name(),
        if last { "[n, 4, B]" } else { "[n, B, 4]" }
    );
    if let (Dim::Fixed(x), Dim::Fixed(y)) = (&b.shape[box_axis], &s.shape[box_axis]) {
        ensure!(
            x == y,
            "`non_maximum_suppression`: {x} boxes but scores for {y}"
        );
    }
    let m = cx.int("max_boxes")?;
    ensure!(
        m > 0,
        "`non_maximum_suppression`: max_boxes {m} must be positive"
    );
    let m = Dim::Fixed(m as usize);
    let n = b.shape[0].clone();
    let k = s.shape[if last { 1 } else { 2 }].clone();
    Ok(if last {
        vec![
            tensor(b.dtype, vec![n.clone(), Dim::Fixed(4), m.clone()]),
            tensor(s.dtype, vec![n.clone(), k, m.clone()]),
            tensor(DType::I32, vec![n, m]),
        ]
    } else {
        vec![
            tensor(b.dtype, vec![n.clone(), m.clone(), Dim::Fixed(4)]),
            tensor(s.dtype, vec![n.clone(), m.clone(), k]),
            tensor(DType::I32, vec![n.clone(), m]),
            tensor(DType::I32, vec![n]),
        ]
    })
}

/// IoU of two `(cx, cy, w, h)` boxes (0 for an empty union).
fn iou(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    let span = |c: f64, w: f64| (c - 0.5 * w, c + 0.5 * w);
    let ((al, ar), (at, ab)) = (span(a[0], a[2]), span(a[1], a[3]));
    let ((bl, br), (bt, bb)) = (span(b[0], b[2]), span(b[1], b[3]));
    let inter = (ar.min(br) - al.max(bl)).max(0.0) * (ab.min(bb) - at.max(bt)).max(0.0);
    let union = a[2] * a[3] + b[2] * b[3] - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// Greedy NMS over `order` (indices, descending score); at most `max` kept.
fn greedy(
    order: &[usize],
    boxes: &[[f64; 4]],
    score: &[f64],
    thr: f64,
    iou_t: f64,
    max: usize,
) -> Vec<usize> {
    let mut kept: Vec<usize> = vec![];
    for &i in order {
        if kept.len() >= max {
            break;
        }
        if score[i] <= thr {
            continue;
        }
        if kept.iter().all(|&j| iou(&boxes[i], &boxes[j]) <= iou_t) {
            kept.push(i);
        }
    }
    kept
}

fn eval_nms(cx: &EvalCx) -> Result<Vec<RValue>> {
    let last = boxes_last(cx.opset);
    let (bt, st) = (cx.t("boxes")?, cx.t("scores")?);
    let (bd, sd) = (bt.dims().to_vec(), st.dims().to_vec());
    let (n, nb, k) = if last {
        (bd[0], bd[2], sd[1])
    } else {
        (bd[0], bd[1], sd[2])
    };
    let bv = kernels::to_vec::<f64>(bt)?;
    let sv = kernels::to_vec::<f64>(st)?;
    let iou_t = cx
        .opt_f64("iou_threshold")?
        .ok_or_else(|| anyhow::anyhow!("`non_maximum_suppression` needs iou_threshold"))?;
    let thr = if last {
        f64::NEG_INFINITY
    } else {
        match cx.opt_f64("score_threshold")? {
            Some(t) => t,
            None => bail!("`non_maximum_suppression` in iOS15 needs score_threshold"),
        }
    };
    let max = cx.int("max_boxes")? as usize;
    let per_class = cx.bool_or_default("per_class_suppression")?;
    let bat = |b: usize, i: usize, c: usize| {
        if last {
            bv[(b * 4 + c) * nb + i]
        } else {
            bv[(b * nb + i) * 4 + c]
        }
    };
    let sat = |b: usize, i: usize, c: usize| {
        if last {
            sv[(b * k + c) * nb + i]
        } else {
            sv[(b * nb + i) * k + c]
        }
    };
    let mut ob = vec![0.0; n * max * 4];
    let mut os = vec![0.0; n * max * k];
    let mut oi = vec![-1.0; n * max];
    let mut oc = vec![0.0; n];
    for b in 0..n {
        let boxes: Vec<[f64; 4]> = (0..nb)
            .map(|i| [bat(b, i, 0), bat(b, i, 1), bat(b, i, 2), bat(b, i, 3)])
            .collect();
        // Best class score and class (first of equals) per box.
        let (score, class): (Vec<f64>, Vec<usize>) = (0..nb)
            .map(|i| {
                (0..k).fold((f64::NEG_INFINITY, 0), |(m, c), j| {
                    let v = sat(b, i, j);
                    if v > m {
                        (v, j)
                    } else {
                        (m, c)
                    }
                })
            })
            .unzip();
        let mut order: Vec<usize> = (0..nb).collect();
        order.sort_by(|&x, &y| score[y].total_cmp(&score[x]));
        let mut ids = if per_class {
            let mut all = vec![];
            let mut seen = vec![false; k];
            for &i in &order {
                let c = class[i];
                if seen[c] {
                    continue;
                }
                seen[c] = true;
                let mine: Vec<usize> = order.iter().copied().filter(|&j| class[j] == c).collect();
                all.extend(greedy(&mine, &boxes, &score, thr, iou_t, max));
            }
            // Merged in score order (their ranks in `order`).
            let rank: Vec<usize> = {
                let mut r = vec![0; nb];
                for (p, &i) in order.iter().enumerate() {
                    r[i] = p;
                }
                r
            };
            all.sort_by_key(|&i| rank[i]);
            all
        } else {
            greedy(&order, &boxes, &score, thr, iou_t, max)
        };
        if ids.is_empty() && nb > 0 {
            ids.push(order[0]);
        }
        ids.truncate(max);
        for (slot, &i) in ids.iter().enumerate() {
            for (c, &e) in boxes[i].iter().enumerate() {
                let at = if last {
                    (b * 4 + c) * max + slot
                } else {
                    (b * max + slot) * 4 + c
                };
                ob[at] = e;
            }
            for c in 0..k {
                let at = if last {
                    (b * k + c) * max + slot
                } else {
                    (b * max + slot) * k + c
                };
                os[at] = sat(b, i, c);
            }
            oi[b * max + slot] = i as f64;
        }
        oc[b] = ids.len() as f64;
    }
    let i32t = candle_core::DType::I32;
    let mut out = vec![
        RValue::T(kernels::data::from_f64(
            ob,
            &if last { [n, 4, max] } else { [n, max, 4] },
            bt.dtype(),
        )?),
        RValue::T(kernels::data::from_f64(
            os,
            &if last { [n, k, max] } else { [n, max, k] },
            st.dtype(),
        )?),
        RValue::T(kernels::data::from_f64(oi, &[n, max], i32t)?),
    ];
    if !last {
        out.push(RValue::T(kernels::data::from_f64(oc, &[n], i32t)?));
    }
    Ok(out)
}

use Opset::{Ios15 as I15, Ios17 as I17};

const NMS15: &[InputSpec] = &[
    req("boxes"),
    req("scores"),
    req_c("iou_threshold"),
    req_c("score_threshold"),
    req_c("max_boxes"),
    opt_c("per_class_suppression").or(DefaultValue::Bool(false)),
];
const NMS17: &[InputSpec] = &[
    req("boxes"),
    req("scores"),
    req_c("iou_threshold"),
    req_c("max_boxes"),
    opt_c("per_class_suppression").or(DefaultValue::Bool(false)),
];

pub static DEFS: &[OpDef] = &[
    v(
        "non_maximum_suppression",
        I15,
        Some(I17),
        NMS15,
        infer_nms,
        eval_nms,
    ),
    v(
        "non_maximum_suppression",
        I17,
        None,
        NMS17,
        infer_nms,
        eval_nms,
    ),
];
