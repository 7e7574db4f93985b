#!/usr/bin/env python3
"""scripts/profile_gpu.py without a GPU: its grids, its spike filter on hand-made curves, and the
bundles it wrote (examples/gpu_profiles) already being clean."""
import glob
import importlib.util
import os
import shutil
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("profile_gpu", os.path.join(ROOT, "scripts", "profile_gpu.py"))
pg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pg)


def read_rows(path, ncoords):
    with open(path) as f:
        lines = f.read().split("\n")[1:]
    rows = []
    for line in filter(None, lines):
        v = line.split(",")
        key = tuple(int(x) for x in v[:ncoords]) if ncoords == 4 else (v[0], int(v[1]))
        rows.append(key + (float(v[-1]),))
    return rows


class GridTest(unittest.TestCase):
    def test_token_grid_is_llmservingsims_up_to_2048(self):
        g = pg.token_grid(2048)
        self.assertEqual(len(g), 152)  # the count of every layer in LLMServingSim's dense.csv
        self.assertEqual(g[:17], list(range(1, 17)) + [20])
        self.assertEqual(g[-2:], [2032, 2048])
        self.assertEqual(pg.token_grid(8192)[-1], 8192)
        self.assertEqual(len(pg.token_grid(8192)), 152 + 24)  # 2,304 ... 8,192 every 256

    def test_attention_grid_is_ascending_and_unique(self):
        for full in (False, True):
            g = pg.attention_grid(full)
            self.assertEqual(g, sorted(set(g)))
            self.assertNotIn((0, 0, 0, 0), g)
            # every decode count of the pure-decode table at every history, x2 from 16
            pure = [r for r in g if r[0] == 0]
            self.assertEqual(len(pure), 9 * 11)
        self.assertEqual(len(pg.attention_grid(False)), 9 * 11 + 9 * 7 * (1 + 5 * 6))


class DespikeTest(unittest.TestCase):
    def test_one_spike_takes_the_next_larger_shapes_time(self):
        rows = [("o_proj", 1, 10.0), ("o_proj", 2, 40.0), ("o_proj", 4, 11.0), ("o_proj", 8, 12.0)]
        out, n = pg.despike(rows, 2, [1])
        self.assertEqual(n, 1)
        self.assertEqual(out, [("o_proj", 1, 10.0), ("o_proj", 2, 11.0), ("o_proj", 4, 11.0),
                               ("o_proj", 8, 12.0)])

    def test_a_run_of_decaying_spikes_is_replaced_whole(self):
        times = [4.0, 555.8, 322.7, 105.0, 59.1, 33.9, 18.5, 4.6, 4.7]
        rows = [("embedding", 16 * (i + 1), t) for i, t in enumerate(times)]
        out, n = pg.despike(rows, 2, [1])
        self.assertEqual(n, 6)
        self.assertEqual([r[2] for r in out], [4.0] + [4.6] * 7 + [4.7])

    def test_noise_and_growth_are_left_alone(self):
        # within 1.5x + 5 us of the next point, or growing: measurements, not spikes
        rows = [("act_fn", 1, 2.1), ("act_fn", 2, 6.0), ("act_fn", 4, 2.2), ("act_fn", 8, 30.0),
                ("act_fn", 16, 31.0)]
        out, n = pg.despike(rows, 2, [1])
        self.assertEqual(n, 0)
        self.assertEqual(out, rows)

    def test_layers_are_separate_curves(self):
        rows = [("a", 1, 100.0), ("a", 2, 101.0), ("b", 1, 1.0), ("b", 2, 1.5)]
        self.assertEqual(pg.despike(rows, 2, [1])[1], 0)

    def test_attention_spike_found_along_its_history_axis(self):
        rows = []
        for kvp in (0, 16, 64, 256):
            for kvd in (16, 64):
                rows.append((32, kvp, 1, kvd, 10.0 + kvp / 16 + kvd / 16))
        rows[2] = (32, 16, 1, 16, 286.2)  # a machine hiccup, as measured on an H100
        out, n = pg.despike(rows, 4)
        self.assertEqual(n, 1)
        fixed = {r[:4]: r[4] for r in out}
        # the next larger history (64) at the same chunk, decode count and decode history
        self.assertEqual(fixed[(32, 16, 1, 16)], 10.0 + 64 / 16 + 16 / 16)


class ShippedBundlesTest(unittest.TestCase):
    def test_shipped_bundles_are_clean_and_whole(self):
        bundles = sorted(glob.glob(os.path.join(ROOT, "examples", "gpu_profiles", "*", "*", "*", "*",
                                                "tp*")))
        self.assertGreaterEqual(len(bundles), 4)
        for tp_dir in bundles:
            for name, ncoords, axes in (("dense.csv", 2, [1]), ("per_sequence.csv", 2, [1]),
                                        ("attention.csv", 4, None)):
                rows = read_rows(os.path.join(tp_dir, name), ncoords)
                self.assertGreater(len(rows), 100, tp_dir + "/" + name)
                out, n = pg.despike(rows, ncoords, axes)
                self.assertEqual(n, 0, tp_dir + "/" + name)
            with open(os.path.join(os.path.dirname(tp_dir), "meta.yaml")) as f:
                meta = f.read()
            self.assertIn("despiked_points:", meta)
            self.assertIn("enabled: false", meta)

    def test_despike_tree_rewrites_a_bundle_and_counts(self):
        tmp = tempfile.mkdtemp()
        try:
            variant = os.path.join(tmp, "GPU", "org", "model", "bf16")
            os.makedirs(os.path.join(variant, "tp1"))
            with open(os.path.join(variant, "meta.yaml"), "w") as f:
                f.write("gpu: test\nskew_fit:\n  enabled: false\n")
            pg.write_csv(os.path.join(variant, "tp1", "dense.csv"), "layer,tokens,time_us",
                         [("o_proj", 1, 10.0), ("o_proj", 2, 90.0), ("o_proj", 4, 12.0)], "%s,%d,%.3f")
            pg.write_csv(os.path.join(variant, "tp1", "per_sequence.csv"), "layer,sequences,time_us",
                         [("lm_head", 1, 300.0), ("lm_head", 2, 301.0)], "%s,%d,%.3f")
            pg.write_csv(os.path.join(variant, "tp1", "attention.csv"),
                         "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us",
                         [(0, 0, 1, 16, 8.0), (0, 0, 1, 32, 8.5)], "%d,%d,%d,%d,%.3f")
            for _ in range(2):  # a second pass finds nothing and keeps one count block
                pg.despike_tree(tmp)
            with open(os.path.join(variant, "tp1", "dense.csv")) as f:
                self.assertEqual(f.read(), "layer,tokens,time_us\no_proj,1,10.000\no_proj,2,12.000\n"
                                           "o_proj,4,12.000\n")
            with open(os.path.join(variant, "meta.yaml")) as f:
                meta = f.read()
            self.assertEqual(meta.count("despiked_points:"), 1)
            self.assertIn("  dense: 1\n", meta)  # the first pass's, kept
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main()
