"""Score a checkpoint on a manifest, or transcribe audio files, decoding greedily or with a beam, a lexicon and an
n-gram LM built from the training transcripts (sparse_asr/decoding).

    python evaluate.py runs/NAME/checkpoints/best --manifest manifests/an4_test.csv [--worst 10]
    python evaluate.py runs/NAME --manifest manifests/an4_test.csv --decoder beam [--lm auto|DIR|none] [--beam-size 64]
    python evaluate.py runs/NAME --manifest manifests/an4_test.csv --average 5 [--average-by dev|last] --decoder beam
    python evaluate.py runs/NAME/checkpoints/best --audio a.wav b.sph [--decoder beam]
    python evaluate.py runs/NAME --manifest manifests/an4_test.csv --emissions runs/NAME/emissions_test.npz
    mpiexec -n 4 python evaluate.py CHECKPOINT --manifest M.csv      (the set is sharded over ranks)

Prints WER, CER and the mean per-utterance WER under each decoder's name (with --decoder beam the greedy scores
too), then the N worst utterances (reference vs hypothesis). The beam's lm_weight, word_score and size come from
the LM directory's tuned.json (python -m sparse_asr.decoding.tune on a dev set), else the defaults, unless given.
Long work prints its progress; inputs unlike the training data (duration, level, converted audio) are named.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sparse_asr.comm import Communicator
from sparse_asr.decoding import DECODERS
from sparse_asr.decoding.lm import DEFAULT_ORDER
from sparse_asr.training.averaging import BY


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint directory written by train.py (RUN/checkpoints/best, last "
                        "or step-N), or a run directory (its last checkpoint)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--manifest", help="score every utterance of this manifest")
    what.add_argument("--audio", nargs="+", help="transcribe these audio files (16 kHz mono WAV or SPHERE)")
    parser.add_argument("--worst", type=at_least(0), default=10, help="how many worst utterances to print (default 10)")
    parser.add_argument("--emissions", help="with --manifest: also write every utterance's log-probabilities to this "
                        ".npz (sparse_asr/training/emissions.py), for decoding later without the checkpoint")
    parser.add_argument("--batch-size", type=at_least(1), default=32, help="global evaluation batch size")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--decoder", choices=DECODERS, default="greedy", help="greedy best path (default) or beam")
    decoding.add_argument("--lm", default="auto", help="with --decoder beam: auto (lexicon + n-gram LM of the training "
                          "manifest, built into lm/), a directory holding lexicon.txt and lm.arpa, or none "
                          "(lexicon-free beam, no LM)")
    decoding.add_argument("--lm-order", type=at_least(1), default=DEFAULT_ORDER, help="n-gram order for --lm auto")
    decoding.add_argument("--train-manifest", help="the training manifest (--lm auto's text, and the durations "
                          "inputs are compared with); default: the checkpoint's data.train_manifest")
    decoding.add_argument("--beam-size", type=at_least(1), help="default: tuned.json's, else 64")
    decoding.add_argument("--lm-weight", type=float, help="weight of the LM's log10 probability (default: tuned)")
    decoding.add_argument("--word-score", type=float, help="score added per word (default: tuned)")
    decoding.add_argument("--tune-on", metavar="DEV_MANIFEST", help="with --decoder beam: first tune lm_weight, "
                          "word_score and the beam on this dev set (decoding/tune.py's grid, printed; saved as "
                          "tuned.json beside the LM)")
    parser.add_argument("--timeout-s", type=float, metavar="SECONDS", help="under mpiexec: end the job when one MPI "
                        "call (start-up and exit included) waits this long, a rank stopped or gone (default: the "
                        "checkpoint's distributed.timeout_s; 0 = never)")
    averaging = parser.add_argument_group("checkpoint averaging")
    averaging.add_argument("--average", type=at_least(1), default=0, metavar="N", help="average the parameters and "
                           "BatchNorm statistics of the run's N best checkpoints (checkpoint: the run directory)")
    averaging.add_argument("--average-by", choices=BY, default="dev", help="dev: the N lowest dev WERs (default); "
                           "last: the N newest")
    args = parser.parse_args(argv)
    if args.emissions and not args.manifest:
        parser.error("--emissions needs --manifest")
    if args.timeout_s is not None and not 0 <= args.timeout_s <= 7 * 24 * 3600:
        parser.error("--timeout-s must be between 0 and a week (604800)")
    if args.decoder == "greedy" and (args.tune_on or any(v is not None for v in (args.beam_size, args.lm_weight,
                                                                                    args.word_score))):
        parser.error("--beam-size, --lm-weight, --word-score and --tune-on need --decoder beam")
    if args.tune_on and (args.lm == "none" or "test" in Path(args.tune_on).name):
        parser.error("--tune-on needs a lexicon and LM (not --lm none) and a dev set, never the test set")
    return args


def at_least(low: int):
    """argparse type: an integer >= low (argparse names the option and the value when it raises)."""
    def check(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(text)
        return value

    check.__name__ = f"integer >= {low}"
    return check


def load_model(args, device, log):
    """The model of a checkpoint (its shared file only, verified against the checkpoint's index), or with --average N
    the average of N of the run's checkpoints; and the (newest) checkpoint's shared content."""
    from sparse_asr.models import build_model
    from sparse_asr.training.checkpoint import CheckpointError, check_state_fits, load_shared

    if args.average:
        from sparse_asr.training.averaging import averaged_model

        state, shared, chosen = averaged_model(run_dir_of(args.checkpoint), args.average, args.average_by)
        log(f"averaged {len(chosen)} checkpoints by {args.average_by}: " + ", ".join(
            path.name + ("" if wer is None else f" (dev WER {wer:.4f})") for path, wer in chosen))
    else:
        _, shared = load_shared(args.checkpoint)
        state = shared["model"]
    model = build_model(shared["config"]["model"]["name"])
    try:  # keys, shapes, dtypes and finite values, named (load_state_dict would cast int64 and take NaN silently)
        check_state_fits("model", model.state_dict(), state)
    except CheckpointError as e:
        raise CheckpointError(f"cannot evaluate {args.checkpoint}: {e}") from None
    model.load_state_dict(state)
    return model.to(device).eval(), shared


def run_dir_of(path) -> Path:
    """The run directory `path` names: itself, or the run of a checkpoint under RUN/checkpoints/."""
    path = Path(path)
    if (path / "checkpoints").is_dir():
        return path
    if path.parent.name == "checkpoints":
        return path.parent.parent
    raise ValueError(f"--average needs a run directory (one holding checkpoints/), got {path}")


def train_manifest_of(args, config: dict) -> str | None:
    """--train-manifest, else the checkpoint's training manifest where it exists here (else None)."""
    if args.train_manifest:
        return args.train_manifest
    path = config.get("data", {}).get("train_manifest")
    return path if path and Path(path).is_file() else None


def tune_on_dev(args, comm, model, device, train_manifest, log) -> None:
    """Collective: the model's emissions on the --tune-on set, the grid decoded on rank 0, tuned.json written
    beside the LM before any rank builds its decoder."""
    from sparse_asr.data.dataset import SpeechDataset
    from sparse_asr.data.manifest import read_manifest
    from sparse_asr.decoding import resolve_lm
    from sparse_asr.decoding.tune import save_tuned, tune
    from sparse_asr.training.evaluation import evaluate

    dataset = SpeechDataset(read_manifest(args.tune_on))
    result = evaluate(model, dataset, comm, device, args.batch_size, keep_emissions=True,
                      progress=Progress(args.tune_on, enabled=comm.rank == 0))
    if comm.rank == 0:
        lm_dir = resolve_lm(args.lm, train_manifest, args.lm_order)
        refs = dict(zip(dataset.utt_ids, dataset.transcripts))
        log(f"tuning the beam on {args.tune_on} ({result.utterances} utterances; greedy WER "
            f"{result.summary['wer']:.4f})")
        best, rows = tune([([lp for _, lp in result.emissions], [refs[u] for u, _ in result.emissions])], lm_dir,
                          log=log)
        save_tuned(lm_dir, f"{args.tune_on} ({args.checkpoint})", best, rows, log)
    comm.barrier()


def make_decoders(args, train_manifest, log) -> list:
    """[the chosen decoder] for greedy; [beam, greedy] for beam (greedy comes free: scores side by side)."""
    from sparse_asr.decoding import GreedyDecoder, make_decoder

    if args.decoder == "greedy":
        return [GreedyDecoder()]
    if args.lm == "auto" and train_manifest is None:
        raise ValueError("--lm auto builds the lexicon and LM from the training manifest: the checkpoint's is not "
                         "here, give --train-manifest")
    beam = make_decoder("beam", args.lm, train_manifest, args.lm_order, args.beam_size, args.lm_weight,
                        args.word_score, log=log)
    return [beam, GreedyDecoder()]


class Progress:
    """'done/total utterances, elapsed, ETA' lines at most every `every_s` seconds; a set done before the first
    interval prints nothing."""

    def __init__(self, what: str, every_s: float = 10.0, enabled: bool = True):
        self.what, self.every_s, self.enabled = what, every_s, enabled
        self.t0 = self.last = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < self.every_s:
            return
        self.last = now
        eta = (now - self.t0) / max(done, 1) * (total - done)
        print(f"{self.what}: {done}/{total} utterances, {now - self.t0:.0f} s, about {eta:.0f} s to go", flush=True)


def check_inputs(comm, paths: list[str], training) -> None:
    """Warn (rank 0, each file named) about inputs unlike the training data: this rank's share read."""
    from sparse_asr.data.audio import load_audio
    from sparse_asr.data.domain import input_warnings

    mine = []
    for i in range(comm.rank, len(paths), comm.size):
        wave = load_audio(paths[i])
        mine += input_warnings(paths[i], wave, 16000, training)
    gathered = comm.gather_object(mine, root=0)
    if comm.rank == 0:
        warnings = sorted(w for part in gathered for w in part)
        for line in warnings:
            print(f"warning: {line}", flush=True)


def training_range(train_manifest):
    from sparse_asr.data.domain import TrainingRange

    return TrainingRange.of(train_manifest) if train_manifest else None


def score_manifest(args, comm, model, device, decoders, training) -> dict:
    from sparse_asr.data.dataset import SpeechDataset
    from sparse_asr.data.manifest import read_manifest
    from sparse_asr.training.evaluation import evaluate
    from sparse_asr.training.runtime import check_manifest_audio

    problems = []  # the manifest's row faults, named in one error with its audio faults
    frame = read_manifest(args.manifest, problems)
    check_manifest_audio(comm, [frame], problems=problems)  # every unusable row named by line, before scoring
    dataset = SpeechDataset(frame)
    check_inputs(comm, dataset.audio, training)
    result = evaluate(model, dataset, comm, device, args.batch_size, keep_rows=args.worst > 0,
                      keep_emissions=bool(args.emissions), decoders=decoders,
                      progress=Progress(args.manifest, enabled=comm.rank == 0))
    if args.emissions and comm.rank == 0:
        from sparse_asr.training.emissions import save_emissions

        save_emissions(args.emissions, [u for u, _ in result.emissions], [lp for _, lp in result.emissions])
        print(f"{args.emissions}: log-probabilities of {len(result.emissions)} utterances")
    if comm.rank == 0:
        print(f"{args.manifest}: {result.utterances} utterances")
        for name, summary in result.by_decoder.items():
            print(f"decoder: {name}")
            for key in ("wer", "cer", "wer_utt_mean", "loss"):
                if key in summary:
                    print(f"  {key:13s} {summary[key]:.4f}")
        rows = sorted(result.rows, key=lambda r: (-(r[1] / max(r[2], 1)), -r[1], r[0]))[: args.worst]
        if rows:
            print(f"worst {len(rows)} utterances (word edits / reference words; decoder: {result.decoder}):")
        for utt_id, edits, words, ref, hyp in rows:
            print(f"  {utt_id}  {edits}/{words}\n    ref: {ref}\n    hyp: {hyp}")
    return result.summary


def transcribe(args, comm, model, device, decoders, training) -> list[str]:
    import torch

    from sparse_asr.data.audio import FeatureExtractor
    from sparse_asr.data.domain import input_warnings, load_converted

    features = FeatureExtractor()
    mine = list(range(comm.rank, len(args.audio), comm.size))  # round-robin shard of the files
    texts, warnings = {}, []
    progress = Progress("transcribing", enabled=comm.rank == 0)
    with torch.no_grad():
        for done, i in enumerate(mine, 1):
            wave, converted = load_converted(args.audio[i])
            warnings += input_warnings(args.audio[i], wave, 16000, training, converted)
            feats = features(wave)
            log_probs, lengths = model(feats[None, None].to(device), torch.tensor([feats.shape[1]]))
            texts[i] = decoders[0].decode(log_probs, lengths)[0]
            progress(min(done * comm.size, len(args.audio)), len(args.audio))
    gathered = comm.gather_object((texts, warnings), root=0)
    if comm.rank != 0:
        return []
    merged = {i: t for part, _ in gathered for i, t in part.items()}
    for line in (w for _, part in gathered for w in part):
        print(f"warning: {line}")
    out = [merged[i] for i in range(len(args.audio))]
    print(f"decoder: {decoders[0].name}")
    for path, text in zip(args.audio, out):
        print(f"{path}: {text}")
    return out


def run(args, comm):
    from sparse_asr.training.launch import setup_process

    def log(line):
        if comm.rank == 0:
            print(line, flush=True)

    device = setup_process(comm, args.device).device
    model, ckpt = load_model(args, device, log)
    p = ckpt["progress"]
    log(f"{args.checkpoint}: model {ckpt['config']['model']['name']}, optimizer step {p['step']}, epoch {p['epoch']}")
    train_manifest = train_manifest_of(args, ckpt["config"])
    if args.tune_on:
        tune_on_dev(args, comm, model, device, train_manifest, log)
    decoders = make_decoders(args, train_manifest, log)
    training = training_range(train_manifest)
    if args.manifest:
        return score_manifest(args, comm, model, device, decoders, training)
    return transcribe(args, comm, model, device, decoders, training)


def main(argv=None) -> int:
    args = parse_args(argv)
    from sparse_asr.training.runtime import StartupGuard, Watchdog, end_job, run_or_abort

    # Guarded like training from MPI start-up to MPI_Finalize: a rank stopped under mpiexec ends the job in
    # timeout_s instead of hanging it.
    timeout = args.timeout_s if args.timeout_s is not None else checkpoint_timeout(args.checkpoint)
    guard = StartupGuard(timeout)
    comm = Communicator()
    guard.disarm()
    watchdog = Watchdog(comm, timeout) if timeout and comm.size > 1 else None
    run_or_abort(comm, run, args, comm)
    if watchdog is not None:
        watchdog.stop()
    end_job(comm, timeout)
    return 0


def checkpoint_timeout(path) -> float:
    """The checkpoint's distributed.timeout_s (read from its index before MPI is up), 0 when it cannot be read:
    the checkpoint is then refused, with its reason, once MPI is up."""
    from sparse_asr.training.checkpoint import locate_checkpoint, read_index
    from sparse_asr.training.config import MAX_TIMEOUT_S

    try:
        timeout = float(read_index(locate_checkpoint(path)[0])["config"]["distributed"]["timeout_s"])
    except Exception:  # noqa: BLE001 -- reported once MPI is up, as every error is
        return 0.0
    return timeout if 0 <= timeout <= MAX_TIMEOUT_S else 0.0


if __name__ == "__main__":
    sys.exit(main())
