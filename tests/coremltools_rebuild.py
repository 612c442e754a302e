"""Rebuilds mlprogram packages with coremltools' own MIL builder and serializer, for
tests/op_conformance.rs's `every_case_also_runs_from_a_package_coremltools_made` test.

For each SRC.mlpackage given, coremltools 9 parses the program
(`milproto.load.load`, which calls `mb.<op>(**inputs)` of coremltools' Builder for every op,
nested blocks included, re-typing each one), and `ct.convert` writes it back out as
DST.mlpackage with no graph pass at all (the main pipeline empty, and the frontend and
backend pipelines, which `ct.convert` does not let a caller set, emptied here), so no op is
folded, fused or renamed: the package holds the same ops, serialized by coremltools (its
constant and blob encodings, its attribute layout, its description).

A program ending in `classify` is rebuilt the way coremltools makes every classifier: the
op is taken out (its probabilities become an output) and `ct.convert` puts it back from a
`ClassifierConfig` with the same classes, naming the label after the original one, so the
package also carries coremltools' classifier description (`predictedFeatureName`, the
label's string / int64 feature, the dictionary feature).

Usage: python coremltools_rebuild.py JOBS.json
JOBS.json: [{"src": ..., "dst": ..., "target": 15|16|17|18}, ...]. Prints one JSON object
per job on stdout: {"dst": ..., "ok": true} or {"dst": ..., "ok": false, "error": ...}.
"""

import json
import logging
import sys
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import coremltools as ct  # noqa: E402
from coremltools.converters.mil import converter as _converter  # noqa: E402
from coremltools.converters.mil.frontend.milproto import load as milproto  # noqa: E402
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline  # noqa: E402

# const_elimination, cast_optimization and the fusions of the backend pipeline would fold or
# rewrite the very op a case tests.
_converter._construct_other_pipelines = lambda *_: (PassPipeline.EMPTY, PassPipeline.EMPTY)

TARGETS = {
    15: ct.target.iOS15,
    16: ct.target.iOS16,
    17: ct.target.iOS17,
    18: ct.target.iOS18,
}


def detach_classify(prog):
    """Takes a `classify` out of the main block; returns the ClassifierConfig that puts it
    back, or None when the program has none."""
    block = prog.functions["main"]
    ops = [op for op in block.operations if op.op_type == "classify"]
    if not ops:
        return None
    op = ops[-1]
    classes_var = op.classes
    vals = getattr(classes_var.val, "ls", classes_var.val)
    classes = [c if isinstance(c, str) else int(c) for c in vals]
    probs = op.probabilities
    label = op.outputs[0].name
    block.set_outputs([v for v in block.outputs if v not in op.outputs] + [probs])
    block.remove_ops([op])
    if classes_var.op is not None and not classes_var.child_ops:
        block.remove_ops([classes_var.op])
    return ct.ClassifierConfig(
        classes,
        predicted_feature_name=label,
        predicted_probabilities_output=probs.name,
    )


def rebuild(src, dst, target):
    spec = ct.utils.load_spec(src)
    prog = milproto.load(
        spec, spec.specificationVersion, f"{src}/Data/com.apple.CoreML/weights"
    )
    classifier = detach_classify(prog)
    model = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=TARGETS[target],
        compute_precision=ct.precision.FLOAT32,
        pass_pipeline=ct.PassPipeline.EMPTY,
        classifier_config=classifier,
        skip_model_load=True,
    )
    model.save(dst)


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        try:
            rebuild(job["src"], job["dst"], job["target"])
            print(json.dumps({"dst": job["dst"], "ok": True}), flush=True)
        except Exception as e:  # reported per package, the others still run
            msg = f"{type(e).__name__}: {e}"
            print(json.dumps({"dst": job["dst"], "ok": False, "error": msg}), flush=True)


if __name__ == "__main__":
    main()
