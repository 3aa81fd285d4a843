"""``python -m calnotes report VAL TEST``: the calibration report of your own model;
``python -m calnotes claims [CHAPTER] [--json]``: the book's verdicts from the stored runs.

VAL and TEST are ``.npz`` files with arrays ``logits (N, C)`` and ``labels (N,)``, or
``.pt``/``.pth`` files holding ``{"logits": tensor, "labels": tensor}``. Every calibrator
is fitted on VAL and measured on TEST, each test metric with a bootstrap interval over
the TEST samples; the calibrator to use is chosen on VAL alone (cross-validated). The
table is printed (``--json``: one JSON object instead) and the figures are written to
``--out``. Files of probabilities are refused as logits; pass them with ``--probs``.
``--alpha A`` adds split conformal sets of TEST calibrated on VAL (LAC, APS, RAPS), their
coverage and size, and writes the sets to ``OUT/conformal_sets.npz``.
Only the toolkit is imported: no training code, no data sets.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m calnotes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("claims", help="the book's claims and verdicts from the stored runs "
                                  "(python -m calnotes claims -h)")
    rep = sub.add_parser("report", help="calibration report of validation and test logits")
    rep.add_argument("val", help="validation logits and labels (.npz, .pt or .pth)")
    rep.add_argument("test", help="test logits and labels (.npz, .pt or .pth)")
    rep.add_argument("--out", default="calibration-report",
                     help="folder for the figures (default: %(default)s)")
    rep.add_argument("--bins", type=int, default=15, help="bins of ECE and MCE (default: 15)")
    rep.add_argument("--methods", default=None,
                     help="comma-separated calibrators, e.g. temperature,vector "
                          "(default: Guo et al.'s set for the number of classes)")
    rep.add_argument("--probs", action="store_true",
                     help="the arrays named logits hold probabilities; their log is used")
    rep.add_argument("--json", action="store_true",
                     help="print the report as one JSON object (for scripts)")
    rep.add_argument("--boot", type=int, default=200,
                     help="bootstrap resamples of the intervals (default: %(default)s)")
    rep.add_argument("--folds", type=int, default=5,
                     help="cross-validation folds on VAL for the recommendation "
                          "(default: %(default)s)")
    rep.add_argument("--save-calibrator", metavar="PATH", default=None,
                     help="save the fitted --calibrator as JSON to PATH")
    rep.add_argument("--alpha", type=float, default=None,
                     help="also give split conformal sets (LAC, APS, RAPS) of the TEST "
                          "samples at miscoverage ALPHA, calibrated on VAL; the sets are "
                          "written to OUT/conformal_sets.npz")
    rep.add_argument("--calibrator", default="temperature",
                     help="which fitted calibrator --save-calibrator writes (default: "
                          "%(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["claims"]:  # the book's verdict table: python -m calnotes claims -h
        from .book.claims import main as claims_main

        try:
            return claims_main(argv[1:])
        except (TypeError, ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    args = _parser().parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")  # figures go to files; no display needed
    from . import report

    try:
        val_logits, val_labels, test_logits, test_labels = report.load_pair(
            args.val, args.test, probs=args.probs)
        methods = (list(report.default_methods(val_logits.shape[1])) if args.methods is None
                   else [m.strip() for m in args.methods.split(",") if m.strip()])
        if args.save_calibrator and args.calibrator not in methods:
            methods.append(args.calibrator)
        rep = report.make_report(val_logits, val_labels, test_logits, test_labels,
                                 methods=methods, n_bins=args.bins, n_boot=args.boot,
                                 n_folds=args.folds)
        if args.save_calibrator and args.calibrator not in rep.calibrators:
            raise ValueError(f"--calibrator {args.calibrator!r} was not fitted; fitted: "
                             f"{', '.join(rep.calibrators)}")
        written = [str(p) for p in rep.save_figures(args.out)]
        conformal = None
        if args.alpha is not None:
            conformal, sets = report.conformal_report(val_logits, val_labels, test_logits,
                                                      test_labels, alpha=args.alpha)
            path = report.save_conformal_sets(sets, args.out)
            written.append(str(path))
        if args.save_calibrator:
            path = rep.calibrators[args.calibrator].save(args.save_calibrator)
            written.append(str(path))
        if args.json:
            data = json.loads(rep.to_json())
            data["files"] = written
            if conformal is not None:
                data["conformal"] = {"alpha": args.alpha,
                                     "scores": conformal.to_dict(orient="index")}
            print(json.dumps(data, indent=1))
        else:
            print(rep.summary())
            if conformal is not None:
                print(f"\nconformal sets at alpha = {args.alpha} (calibrated on VAL, measured "
                      f"on TEST; band: 95% range of the coverage the guarantee allows)")
                print(conformal.to_string(float_format=lambda x: f"{x:.4f}"))
            for name in written:
                note = (f" ({args.calibrator}; load it with calnotes.calibrators.load)"
                        if args.save_calibrator and name == written[-1] else "")
                print(f"wrote {name}{note}")
    except (TypeError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
