"""Audio loading, features, dataset/collate and the distributed bucketing sampler, on real AN4 audio."""
import numpy as np
import pytest
import soundfile
import torch

from sparse_asr.data.audio import AudioError, FeatureExtractor, SpecAugment, audio_frames, load_audio
from sparse_asr.data.dataset import BucketingSampler, SpeechDataset, collate, make_loader
from sparse_asr.data.manifest import audio_problem, read_manifest
from sparse_asr.data.text import text_to_ids


@pytest.fixture(scope="module")
def tiny(tiny_manifest):
    return read_manifest(tiny_manifest)


@pytest.fixture(scope="module")
def real_wave(tiny):
    path = tiny["audio"][0]
    data, rate = soundfile.read(path, dtype="int16")
    return path, data, rate


# ---------------------------------------------------------------- audio

def test_load_audio_reads_sphere_and_wav_alike(real_wave, tmp_path):
    path, data, rate = real_wave
    wave = load_audio(path)
    assert wave.dtype == torch.float32 and wave.dim() == 1 and len(wave) == len(data)
    assert wave.abs().max() <= 1.0
    assert torch.equal(wave, torch.from_numpy(data.astype(np.float32) / 32768))  # PCM16 scaling, exact
    wav = tmp_path / "copy.wav"
    soundfile.write(wav, data, rate, subtype="PCM_16")
    assert torch.equal(load_audio(wav), wave)


def test_wrong_sample_rate(real_wave, tmp_path):
    _, data, _ = real_wave
    path = tmp_path / "eight_khz.wav"
    soundfile.write(path, data[::2], 8000, subtype="PCM_16")
    with pytest.raises(AudioError, match="8000 Hz") as error:
        load_audio(path)
    assert str(path) in str(error.value)


def test_stereo(real_wave, tmp_path):
    _, data, rate = real_wave
    path = tmp_path / "stereo.wav"
    soundfile.write(path, np.stack([data, data], axis=1), rate, subtype="PCM_16")
    with pytest.raises(AudioError, match="2 channels") as error:
        load_audio(path)
    assert str(path) in str(error.value)


def test_corrupt_files(real_wave, tmp_path):
    path, data, rate = real_wave
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(np.random.default_rng(0).bytes(5000))
    sphere_cut = tmp_path / "cut.sph"  # a real SPHERE file cut in the middle of its samples
    sphere_cut.write_bytes(open(path, "rb").read()[:4000])
    wav = tmp_path / "full.wav"
    soundfile.write(wav, data, rate, subtype="PCM_16")
    wav_cut = tmp_path / "cut.wav"
    wav_cut.write_bytes(wav.read_bytes()[:3000])
    header_only = tmp_path / "header_only.sph"
    header_only.write_bytes(open(path, "rb").read()[:300])
    for bad in (garbage, sphere_cut, wav_cut, header_only, tmp_path / "absent.wav"):
        with pytest.raises(AudioError) as error:
            load_audio(bad)
        assert str(bad) in str(error.value), error.value
    with pytest.raises(AudioError, match="truncated"):
        load_audio(sphere_cut)
    with pytest.raises(AudioError, match="truncated"):
        load_audio(wav_cut)
    for bad, reason in [(sphere_cut, "truncated"), (wav_cut, "truncated"), (garbage, "cannot read audio"),
                        (header_only, "cannot read audio"), (tmp_path / "absent.wav", "file does not exist"),
                        (tmp_path, "not a regular file")]:
        with pytest.raises(AudioError, match=reason) as error:  # the header alone tells
            audio_frames(bad)
        assert str(error.value).startswith(f"{bad}: ") and "System error" not in str(error.value)


def test_header_check_agrees_with_decoding(tiny, real_wave, tmp_path):
    """audio_frames (header only) gives exactly the decoded length, for SPHERE and WAV; audio_problem
    adds the manifest's duration, within DURATION_TOLERANCE_S."""
    for path in tiny["audio"]:
        assert audio_frames(path) == len(load_audio(path))
    path, data, rate = real_wave
    wav = tmp_path / "copy.wav"
    soundfile.write(wav, data, rate, subtype="PCM_16")
    assert audio_frames(wav) == len(data)
    seconds = len(data) / rate
    assert audio_problem(str(wav), seconds) is None and audio_problem(str(wav), round(seconds, 1)) is None
    assert audio_problem(str(wav), seconds + 0.5) == (f"{wav}: holds {seconds:.3f} s of audio, "
                                                      f"the manifest says {seconds + 0.5:.3f} s")
    assert audio_problem(str(tmp_path / "gone.wav"), 1.0) == f"{tmp_path / 'gone.wav'}: file does not exist"


# ---------------------------------------------------------------- features

def reference_features(wave: np.ndarray) -> np.ndarray:
    """The same features by hand with numpy: centred frames (reflect padding), periodic Hamming
    window, |rfft|, log1p, whole-utterance normalisation with the unbiased std."""
    n_fft, hop = 320, 160
    padded = np.pad(wave.astype(np.float64), n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop]
    window = 0.54 - 0.46 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    spec = np.log1p(np.abs(np.fft.rfft(frames * window, axis=1))).T
    return (spec - spec.mean()) / spec.std(ddof=1)


def test_features_match_numpy_reference(tiny):
    extractor = FeatureExtractor()
    for path in tiny["audio"][:3]:
        wave = load_audio(path)
        feats = extractor(wave)
        assert feats.shape == (161, 1 + len(wave) // 160) and feats.dtype == torch.float32
        assert extractor.num_frames(len(wave)) == feats.shape[1]
        assert abs(feats.mean().item()) < 1e-4 and abs(feats.std().item() - 1) < 1e-4
        np.testing.assert_allclose(feats.numpy(), reference_features(wave.numpy()), atol=2e-4)


@pytest.mark.unit
def test_features_of_silence_and_too_short_input():
    assert torch.isfinite(FeatureExtractor()(torch.zeros(16000))).all()
    with pytest.raises(ValueError, match="too short"):
        FeatureExtractor()(torch.zeros(100))


# ---------------------------------------------------------------- dataset and collate

def test_dataset_items_and_collate(tiny_manifest, tiny):
    dataset = SpeechDataset(tiny_manifest)
    assert len(dataset) == 8 and list(dataset.utt_ids) == list(tiny["utt_id"])
    np.testing.assert_array_equal(dataset.durations, tiny["duration"].to_numpy())
    items = [dataset[i] for i in (5, 0, 3)]
    for feats, target, i in items:
        samples = int(round(tiny["duration"][i] * 16000))
        assert feats.shape == (161, 1 + samples // 160)
        assert target.tolist() == text_to_ids(tiny["transcript"][i])
    batch = collate(items)
    order = sorted(items, key=lambda item: -item[0].shape[1])
    assert batch.indices == [item[2] for item in order]
    assert batch.features.shape == (3, 1, 161, order[0][0].shape[1])
    assert batch.feature_lengths.tolist() == [item[0].shape[1] for item in order]
    assert batch.feature_lengths.dtype == torch.int64 and batch.target_lengths.dtype == torch.int64
    assert batch.targets.tolist() == sum((item[1].tolist() for item in order), [])
    assert batch.target_lengths.tolist() == [len(item[1]) for item in order]
    for b, (feats, _, _) in enumerate(order):
        assert torch.equal(batch.features[b, 0, :, : feats.shape[1]], feats)
        assert not batch.features[b, 0, :, feats.shape[1]:].any()  # zero padding


def test_dataset_names_bad_transcript(tiny):
    bad = tiny.copy()
    bad.loc[2, "transcript"] = "HELLO 42"
    with pytest.raises(ValueError, match=r":4 \(.*'4'") as error:  # row 2 is line 4 of the file (header + 1-based)
        SpeechDataset(bad)
    assert bad.attrs["manifest"] in str(error.value)


def test_loader_yields_sampler_batches(tiny_manifest):
    dataset = SpeechDataset(tiny_manifest)
    sampler = BucketingSampler(dataset.durations, global_batch_size=4, seed=3)
    for workers in (0, 1):
        batches = list(make_loader(dataset, sampler, num_workers=workers))
        assert [sorted(b.indices) for b in batches] == [sorted(s) for s in sampler]
        assert len(batches) == len(sampler) == 2



# ---------------------------------------------------------------- augmentation

def masked_rows_and_columns(original, masked):
    """Check that `masked` is `original` with some whole rows (bins) and whole columns (frames) set
    to exactly 0 and everything else bit-identical; return the sorted (rows, columns) indices."""
    assert masked.shape == original.shape and masked.dtype == original.dtype
    assert (original != 0).all()  # so every zero in `masked` comes from a mask
    zero = masked == 0
    rows, columns = zero.all(1).nonzero().flatten(), zero.all(0).nonzero().flatten()
    expected = torch.zeros_like(zero)
    expected[rows, :] = True
    expected[:, columns] = True
    assert torch.equal(zero, expected), "zeros outside whole masked rows/columns"
    assert torch.equal(masked[~zero], original[~zero])
    return rows.tolist(), columns.tolist()


def runs(indices):
    """Lengths of the runs of consecutive integers in a sorted list."""
    lengths = []
    for k, i in enumerate(indices):
        if k and i == indices[k - 1] + 1:
            lengths[-1] += 1
        else:
            lengths.append(1)
    return lengths


def test_spec_augment_masks_whole_bands_only(tiny):
    feats = FeatureExtractor()(load_audio(tiny["audio"][7]))
    frames = feats.shape[1]
    augment = SpecAugment(freq_masks=2, freq_mask_width=15, time_masks=2, time_mask_width=25,
                          time_mask_max_fraction=0.1)
    time_cap = min(25, int(0.1 * frames))  # 0.1 * T caps the width of these short utterances
    assert 1 <= time_cap < 25
    seen_masked = False
    for seed in range(50):
        before = feats.clone()
        rows, columns = masked_rows_and_columns(feats, augment(feats, np.random.default_rng(seed)))
        assert torch.equal(feats, before)  # the input is not modified
        assert len(rows) <= 2 * 15 and len(runs(rows)) <= 2  # two bands, which may overlap
        assert len(columns) <= 2 * time_cap and len(runs(columns)) <= 2
        seen_masked |= bool(rows) and bool(columns)
    assert seen_masked
    assert torch.equal(SpecAugment()(feats, np.random.default_rng(0)), feats)  # 0 masks = off
    assert not SpecAugment().enabled and SpecAugment(time_masks=1).enabled


def test_spec_augment_widths_and_positions_are_uniform_over_their_range(tiny):
    """One mask of each kind: over many draws every width 0..max occurs (max capped by the time
    fraction), none beyond it, and bands reach both edges of the spectrogram."""
    feats = FeatureExtractor()(load_audio(tiny["audio"][7]))
    bins, frames = feats.shape
    time_cap = min(25, int(0.1 * frames))
    augment = SpecAugment(freq_masks=1, freq_mask_width=15, time_masks=1, time_mask_width=25)
    widths_f, widths_t, rows_hit, columns_hit = set(), set(), set(), set()
    for seed in range(400):
        rows, columns = masked_rows_and_columns(feats, augment(feats, np.random.default_rng(seed)))
        assert runs(rows) in ([], [len(rows)]) and runs(columns) in ([], [len(columns)])  # one band each
        widths_f.add(len(rows))
        widths_t.add(len(columns))
        rows_hit.update(rows)
        columns_hit.update(columns)
    assert widths_f == set(range(16)) and widths_t == set(range(time_cap + 1))
    assert {0, bins - 1} <= rows_hit and {0, frames - 1} <= columns_hit


@pytest.mark.unit
def test_spec_augment_rejects_bad_settings():
    for kwargs, message in [({"freq_masks": -1}, "mask counts"), ({"time_mask_width": 0}, "mask widths"),
                            ({"time_mask_max_fraction": 0}, "time_mask_max_fraction"),
                            ({"time_mask_max_fraction": 1.5}, "time_mask_max_fraction")]:
        with pytest.raises(ValueError, match=message):
            SpecAugment(**kwargs)
    with pytest.raises(ValueError, match="bins, frames"):
        SpecAugment(freq_masks=1)(torch.ones(3, 4, 5), np.random.default_rng(0))


def test_dataset_without_masks_is_bit_identical(tiny_manifest):
    plain = SpeechDataset(tiny_manifest)
    off = SpeechDataset(tiny_manifest, augment=SpecAugment(freq_masks=0, time_masks=0), seed=3)
    assert off.augment is None
    off.set_epoch(5)
    for i in range(len(plain)):
        assert torch.equal(off[i][0], plain[i][0])


def test_dataset_masks_are_a_function_of_seed_epoch_and_item(tiny_manifest):
    plain = SpeechDataset(tiny_manifest)
    augment = SpecAugment(freq_masks=2, time_masks=2)

    def features(seed, epoch, workers=0):
        dataset = SpeechDataset(tiny_manifest, augment=augment, seed=seed)
        dataset.set_epoch(epoch)
        loader = make_loader(dataset, BucketingSampler(dataset.durations, 4, seed=seed), num_workers=workers)
        return {i: batch.features[b, 0, :, : batch.feature_lengths[b]]
                for batch in loader for b, i in enumerate(batch.indices)}

    torch.manual_seed(0)
    reference = features(seed=1, epoch=0)
    state = torch.get_rng_state()
    again = SpeechDataset(tiny_manifest, augment=augment, seed=1)
    items = {i: again[i][0] for i in reversed(range(len(again)))}  # another order, another torch RNG state
    assert torch.equal(torch.get_rng_state(), state)  # the masks never draw from the global RNG
    torch.manual_seed(123)
    for other in (items, features(seed=1, epoch=0), features(seed=1, epoch=0, workers=1)):
        assert other.keys() == reference.keys() and all(torch.equal(other[i], reference[i]) for i in reference)
    masked = 0
    for i, feats in reference.items():
        rows, columns = masked_rows_and_columns(plain[i][0], feats)
        masked += len(rows) + len(columns)
    assert masked > 0
    for changed in (features(seed=1, epoch=1), features(seed=2, epoch=0)):
        assert any(not torch.equal(changed[i], reference[i]) for i in reference)


# ---------------------------------------------------------------- sampler

DURATIONS = np.random.default_rng(7).uniform(0.5, 6.0, size=103)  # 103: leaves a partial global batch


def rank_batches(durations, world_size, epoch=0, **kwargs):
    per_rank = []
    for rank in range(world_size):
        sampler = BucketingSampler(durations, rank=rank, world_size=world_size, **kwargs)
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
        assert len(sampler) == len(per_rank[-1])
    return per_rank


@pytest.mark.unit
def test_sampler_shares_are_disjoint_equal_and_independent_of_world_size():
    reference = None
    for world_size in (1, 2, 3, 4):
        per_rank = rank_batches(DURATIONS, world_size, global_batch_size=12, seed=5)
        counts = {len(batches) for batches in per_rank}
        assert counts == {103 // 12}, "every rank must run the same number of steps"
        assert all(len(b) == 12 // world_size for batches in per_rank for b in batches)
        flat = [i for batches in per_rank for b in batches for i in b]
        assert len(flat) == len(set(flat)) == 103 // 12 * 12  # disjoint, remainder dropped
        global_batches = [frozenset().union(*(per_rank[r][step] for r in range(world_size)))
                          for step in range(len(per_rank[0]))]
        reference = reference or global_batches
        assert global_batches == reference
    # bucketing: a global batch holds neighbours in duration order
    order = np.argsort(DURATIONS, kind="stable")
    rank_in_order = {int(index): position for position, index in enumerate(order)}
    for batch in reference:
        positions = sorted(rank_in_order[i] for i in batch)
        assert positions[-1] - positions[0] < 12 + 103 % 12


@pytest.mark.unit
def test_sampler_epochs_and_seeds():
    def epoch_order(epoch, seed):
        return rank_batches(DURATIONS, 2, epoch=epoch, global_batch_size=8, seed=seed)
    assert epoch_order(0, 1) == epoch_order(0, 1)
    assert epoch_order(0, 1) != epoch_order(1, 1)
    assert epoch_order(0, 1) != epoch_order(0, 2)
    # dropped utterances change from epoch to epoch, so none is never trained on
    seen = set()
    for epoch in range(10):
        seen |= {i for batches in epoch_order(epoch, 1) for b in batches for i in b}
    assert seen == set(range(103))


@pytest.mark.unit
def test_sampler_resume_matches_tail_of_epoch():
    full = rank_batches(DURATIONS, 3, epoch=4, global_batch_size=9, seed=0)
    for rank in range(3):
        sampler = BucketingSampler(DURATIONS, 9, rank=rank, world_size=3, seed=0)
        sampler.set_epoch(4, start_batch=5)
        assert list(sampler) == full[rank][5:] and len(sampler) == len(full[rank]) - 5
        assert sampler.batches_per_epoch == len(full[rank])
        sampler.set_epoch(5)
        assert len(list(sampler)) == len(full[rank])


@pytest.mark.unit
def test_sampler_sortagrad_epochs_run_shortest_first():
    """SortaGrad: epochs below sorted_epochs run the same global batches as a shuffled epoch would (the same
    dropped remainder), ordered shortest first on every rank and world size; later epochs are shuffled as before."""
    for world_size in (1, 2, 3):
        for epoch in (0, 1):
            sorted_run = rank_batches(DURATIONS, world_size, epoch=epoch, global_batch_size=12, seed=5, sorted_epochs=2)
            shuffled = rank_batches(DURATIONS, world_size, epoch=epoch, global_batch_size=12, seed=5)
            def merged(per_rank):
                return [sorted(i for r in per_rank for i in r[step]) for step in range(len(per_rank[0]))]
            assert sorted(merged(sorted_run)) == sorted(merged(shuffled))
            longest = [DURATIONS[batch].max() for batch in merged(sorted_run)]
            assert longest == sorted(longest) and merged(sorted_run) != merged(shuffled)
        assert rank_batches(DURATIONS, world_size, epoch=2, global_batch_size=12, seed=5, sorted_epochs=2) == \
            rank_batches(DURATIONS, world_size, epoch=2, global_batch_size=12, seed=5)
    with pytest.raises(ValueError, match="sorted_epochs"):
        BucketingSampler(DURATIONS, 8, sorted_epochs=-1)


@pytest.mark.unit
def test_sampler_eval_covers_everything_once():
    for world_size in (1, 2, 3, 4):
        per_rank = rank_batches(DURATIONS, world_size, global_batch_size=12, shuffle=False, drop_last=False)
        flat = sorted(i for batches in per_rank for b in batches for i in b)
        assert flat == list(range(103))
        assert all(len(b) > 0 for batches in per_rank for b in batches)
    # without shuffling, batches run from the shortest to the longest utterances
    (single,) = rank_batches(DURATIONS, 1, global_batch_size=8, shuffle=False, drop_last=False)
    firsts = [DURATIONS[b].max() for b in single]
    assert firsts == sorted(firsts)


@pytest.mark.unit
def test_sampler_rejects_bad_configuration():
    with pytest.raises(ValueError, match="multiple of world_size 3"):
        BucketingSampler(DURATIONS, 8, rank=0, world_size=3)
    with pytest.raises(ValueError, match="rank 4"):
        BucketingSampler(DURATIONS, 8, rank=4, world_size=4)
    with pytest.raises(ValueError, match="not one full global batch"):
        BucketingSampler(DURATIONS[:5], 8)
