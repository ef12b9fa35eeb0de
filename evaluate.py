"""Score a checkpoint on a manifest, or transcribe audio files (greedy CTC decoding).

    python evaluate.py runs/NAME/checkpoints/best --manifest manifests/an4_test.csv [--worst 10]
    python evaluate.py runs/NAME/checkpoints/best --audio a.wav b.sph
    python evaluate.py runs/NAME --manifest manifests/an4_test.csv --emissions runs/NAME/emissions_test.npz
    mpiexec -n 4 python evaluate.py CHECKPOINT --manifest M.csv      (the set is sharded over ranks)

Prints WER, CER and the mean per-utterance WER, then the N worst utterances (reference vs hypothesis).
"""
from __future__ import annotations

import argparse
import sys

from sparse_asr.comm import Communicator


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
    args = parser.parse_args(argv)
    if args.emissions and not args.manifest:
        parser.error("--emissions needs --manifest")
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


def load_model(path, device):
    """The model of a checkpoint (its shared file only, verified against the checkpoint's index) and that file's
    content."""
    from sparse_asr.models import build_model
    from sparse_asr.training.checkpoint import load_shared

    _, shared = load_shared(path)
    model = build_model(shared["config"]["model"]["name"])
    model.load_state_dict(shared["model"])
    return model.to(device).eval(), shared


def score_manifest(args, comm, model, device) -> dict:
    from sparse_asr.data.dataset import SpeechDataset
    from sparse_asr.data.manifest import read_manifest
    from sparse_asr.training.evaluation import evaluate
    from sparse_asr.training.runtime import check_manifest_audio

    frame = read_manifest(args.manifest)
    check_manifest_audio(comm, [frame])  # every unusable audio file named by manifest line, before scoring
    dataset = SpeechDataset(frame)
    result = evaluate(model, dataset, comm, device, args.batch_size, keep_rows=args.worst > 0,
                      keep_emissions=bool(args.emissions))
    if args.emissions and comm.rank == 0:
        from sparse_asr.training.emissions import save_emissions

        save_emissions(args.emissions, [u for u, _ in result.emissions], [lp for _, lp in result.emissions])
        print(f"{args.emissions}: log-probabilities of {len(result.emissions)} utterances")
    if comm.rank == 0:
        print(f"{args.manifest}: {result.utterances} utterances")
        for key in ("wer", "cer", "wer_utt_mean", "loss"):
            if key in result.summary:
                print(f"  {key:13s} {result.summary[key]:.4f}")
        rows = sorted(result.rows, key=lambda r: (-(r[1] / max(r[2], 1)), -r[1], r[0]))[: args.worst]
        if rows:
            print(f"worst {len(rows)} utterances (word edits / reference words):")
        for utt_id, edits, words, ref, hyp in rows:
            print(f"  {utt_id}  {edits}/{words}\n    ref: {ref}\n    hyp: {hyp}")
    return result.summary


def transcribe(args, comm, model, device) -> list[str]:
    import torch

    from sparse_asr.data.audio import FeatureExtractor, load_audio
    from sparse_asr.data.text import greedy_decode

    features = FeatureExtractor()
    mine = list(range(comm.rank, len(args.audio), comm.size))  # round-robin shard of the files
    texts = {}
    with torch.no_grad():
        for i in mine:
            feats = features(load_audio(args.audio[i]))
            log_probs, lengths = model(feats[None, None].to(device), torch.tensor([feats.shape[1]]))
            texts[i] = greedy_decode(log_probs, lengths)[0]
    gathered = comm.gather_object(texts, root=0)
    if comm.rank != 0:
        return []
    merged = {i: t for part in gathered for i, t in part.items()}
    out = [merged[i] for i in range(len(args.audio))]
    for path, text in zip(args.audio, out):
        print(f"{path}: {text}")
    return out


def run(args, comm):
    from sparse_asr.training.launch import setup_process

    device = setup_process(comm, args.device).device
    model, ckpt = load_model(args.checkpoint, device)
    if comm.rank == 0:
        p = ckpt["progress"]
        print(f"{args.checkpoint}: model {ckpt['config']['model']['name']}, optimizer step {p['step']}, "
              f"epoch {p['epoch']}")
    if args.manifest:
        return score_manifest(args, comm, model, device)
    return transcribe(args, comm, model, device)


def main(argv=None) -> int:
    args = parse_args(argv)
    comm = Communicator()
    from sparse_asr.training.runtime import run_or_abort

    run_or_abort(comm, run, args, comm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
