#!/usr/bin/env python3
"""Compares `servesim study attacc` with the AttAcc authors' simulator, point by point.

For every row of the study's CSV, this runs the authors' simulator (scale-snu/attacc_simulator,
checked at commit c1540de) on the same model, system, policy, lengths and batch, and prints
servesim / authors ratios of decode throughput and of energy per generated token
(docs/energy.md, "The AttAcc study", has the results and how they were obtained):

    build/services/servesim study attacc --out out/attacc_study --no-trace
    python3 scripts/compare_attacc_authors.py --authors ~/attacc_simulator \\
        --study out/attacc_study/attacc_study.csv --out out/attacc_study/vs_authors.csv

Needs Python 3 with pandas (their code imports it; Debian: python3-pandas). Their AttAcc attention
timing comes from Ramulator2 with their patches (their set_pim_ramulator.sh builds it into
<authors>/ramulator2); without that build, the DGX+AttAccs rows are skipped and said so.

How their outputs are read (src/system.py `simulate`): `perfs[0]` holds the generation stages' time
per step in ms (all decoders: `perf[7]`) and their energy per step in nJ, summed over every GPU and
AttAcc (`energy[0]`). Throughput = batch / step time; J per token = energy x 1e-9 / batch.
"""
import argparse
import contextlib
import csv
import io
import os
import statistics
import sys

MODELS = {'llama-65b': ('LLAMA-65B', 2), 'gpt3-175b': ('GPT-175B', 2), 'mt-nlg-530b': ('MT-530B', 1)}
MEMORY_GIB = {'dgx_base': 80, 'dgx_large': 160, 'dgx_attacc': 80}
POLICIES = {'serial': (False, False), 'hl_pipe': (True, False), 'hl_pipe_ff': (True, True)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--authors', required=True, help='a checkout of scale-snu/attacc_simulator')
    ap.add_argument('--study', required=True, help="servesim's attacc_study.csv")
    ap.add_argument('--out', help='per-point CSV to write')
    ap.add_argument('--no-power-constraint', action='store_true',
                    help="AttAcc without the paper's power cap (servesim's attacc_bank preset has it)")
    args = ap.parse_args()

    authors = os.path.abspath(args.authors)
    if not os.path.exists(os.path.join(authors, 'src', 'system.py')):
        sys.exit(f'{authors}: no src/system.py; expected a checkout of scale-snu/attacc_simulator')
    os.chdir(authors)  # their Ramulator wrapper opens ./ramulator2 and ./ramulator.out
    sys.path.insert(0, authors)
    from src.config import make_model_config, make_pim_config, make_xpu_config
    from src.system import System
    from src.type import DataType, DeviceType, GPUType, InterfaceType, PIMType
    have_ramulator = os.path.exists(os.path.join(authors, 'ramulator2', 'ramulator2'))
    power = not args.no_power_constraint

    def run(model, system, policy, lin, lout, batch):
        name, word = MODELS[model]
        infos = make_model_config(name, DataType.W16A16 if word == 2 else DataType.W8A8)
        xpu = make_xpu_config(GPUType.A100a, num_gpu=8, mem_cap=MEMORY_GIB[system] * 1024**3)
        sim = System(xpu['GPU'], infos)
        pipe, ff = False, False
        if system == 'dgx_attacc':
            sim.set_accelerator(infos, DeviceType.PIM,
                                make_pim_config(PIMType.BA, InterfaceType.NVLINK3,
                                                power_constraint=power))
            pipe, ff = POLICIES[policy]
        perfs = []
        with contextlib.redirect_stdout(io.StringIO()):
            sim.simulate(batch, lin, lout, perfs=perfs, pipe=pipe, parallel_ff=ff,
                         power_constraint=power)
        _, _, perf, energy = perfs[0]
        step_ms = perf[7]
        return batch / (step_ms * 1e-3), energy[0] * 1e-9 / batch, step_ms

    rows, skipped, memo = [], {'no batch': 0, 'no ramulator2': 0}, {}
    with open(args.study) as f:
        for r in csv.DictReader(f):
            batch = int(r['max_batch'])
            if batch < 1:
                skipped['no batch'] += 1
                continue
            if r['system'] == 'dgx_attacc' and not have_ramulator:
                skipped['no ramulator2'] += 1
                continue
            key = (r['model'], r['system'], r['policy'], int(r['lin']), int(r['lout']), batch)
            if key not in memo:
                memo[key] = run(*key)
            tput, jpt, step_ms = memo[key]
            rows.append(dict(r, authors_tbt_ms=step_ms, authors_throughput_tokens_per_s=tput,
                             authors_energy_j_per_token=jpt,
                             throughput_ratio=float(r['throughput_tokens_per_s']) / tput,
                             energy_ratio=float(r['energy_j_per_token']) / jpt))
    if args.out and rows:
        with open(args.out, 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    print('servesim / authors at servesim\'s batch (min / median / max)')
    print(f'{"model":<12} {"system":<11} {"policy":<11} {"n":>3}  {"throughput":<20}  energy per token')
    groups = {}
    for r in rows:
        groups.setdefault((r['model'], r['system'], r['policy']), []).append(r)
    for (model, system, policy), g in groups.items():
        t = [r['throughput_ratio'] for r in g]
        e = [r['energy_ratio'] for r in g]
        print(f'{model:<12} {system:<11} {policy:<11} {len(g):>3}  '
              f'{min(t):.3f} {statistics.median(t):.3f} {max(t):.3f}   '
              f'{min(e):.3f} {statistics.median(e):.3f} {max(e):.3f}')
    for why, n in skipped.items():
        if n:
            print(f'skipped, {why}: {n} rows')


if __name__ == '__main__':
    main()
