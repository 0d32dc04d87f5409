#!/usr/bin/env python3
"""Fails when a list of optimizers in the docs, the headers or the apps'
sources misses one of the descriptors' (SHARDOPT_OPTIMIZERS in
include/shardopt/optimizers.hpp): a paragraph (lines between blank lines)
that names most of them, at least all but two, must name every one. Lists
of some optimizers on purpose (those with betas, with eps) name fewer.
Before checking the tree it checks itself on a planted list with one
optimizer missing, which must be found.
Usage: check_optimizer_lists.py SOURCE_ROOT"""
import pathlib
import re
import sys

SLACK = 2  # a paragraph naming at least all but SLACK optimizers is a list


def optimizers(root):
    text = (root / 'include/shardopt/optimizers.hpp').read_text()
    block = re.search(r'^#define SHARDOPT_OPTIMIZERS\(X\)(.*?)^$', text, re.M | re.S)
    if block is None:
        sys.exit('optimizer-lists: SHARDOPT_OPTIMIZERS not found in include/shardopt/optimizers.hpp')
    return [n.lower() for n in re.findall(r'X\((\w+)\)', block.group(1))]


def paragraphs(text):
    """(first line number, text) of each block of non-blank lines."""
    start, lines = None, []
    for i, line in enumerate(text.split('\n') + [''], 1):
        if line.strip():
            if start is None:
                start = i
            lines.append(line)
        elif start is not None:
            yield start, '\n'.join(lines)
            start, lines = None, []


def check(path, text, keys):
    found = []
    for line, para in paragraphs(text):
        named = {k for k in keys if re.search(r'(?<![\w-])' + k + r'(?![\w-])', para, re.I)}
        if len(keys) - SLACK <= len(named) < len(keys):
            missing = ' '.join(k for k in keys if k not in named)
            found.append(f'{path}:{line}: a list of optimizers without {missing}')
    return found


def files(root):
    for pattern in ('README.md', 'docs/*.md', 'kernels/README.md', 'include/shardopt/*',
                    'apps/**/*.cpp', 'apps/**/*.hpp', 'apps/**/*.md', 'scripts/*'):
        for p in sorted(root.glob(pattern)):
            # The benchmark records keep the lists of the runs they record.
            if p.is_file() and p.name != 'benchmarks.md':
                yield p


def main():
    root = pathlib.Path(sys.argv[1])
    keys = optimizers(root)
    if len(keys) < SLACK + 3:
        sys.exit(f'optimizer-lists: only {len(keys)} optimizers read from SHARDOPT_OPTIMIZERS')
    planted = 'Optimizers: ' + ', '.join(keys[:-1]) + '.\n'
    if not check('self-check', planted, keys) or check('self-check', planted + keys[-1], keys):
        sys.exit('optimizer-lists: self-check failed: a planted list missing '
                 f'{keys[-1]} was not found, or a complete one was rejected')
    bad = []
    for p in files(root):
        bad += check(p.relative_to(root), p.read_text(errors='replace'), keys)
    for b in bad:
        print('optimizer-lists: ' + b)
    print(f'optimizer-lists: {len(keys)} optimizers, {len(bad)} incomplete lists')
    return 1 if bad else 0


sys.exit(main())
