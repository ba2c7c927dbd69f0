"""A training process's torch threads (pretrain.runtime.threads): the setting, else an
exported OMP_NUM_THREADS, else this process's cores split between the node's ranks."""

import os

from pretrain.runtime.threads import available_cores, training_threads


def test_the_cores_of_the_affinity_mask():
    assert available_cores() == len(os.sched_getaffinity(0)) >= 1


def test_an_explicit_setting_wins():
    assert training_threads(3, devices=2, environ={"OMP_NUM_THREADS": "1"}) == 3


def test_an_exported_omp_num_threads_comes_next():
    assert training_threads(None, environ={"OMP_NUM_THREADS": "1"}) == 1
    assert training_threads(None, devices=4, environ={"OMP_NUM_THREADS": " 2 "}) == 2


def test_else_the_available_cores_split_between_ranks():
    cores = available_cores()
    for unset in ({}, {"OMP_NUM_THREADS": ""}, {"OMP_NUM_THREADS": "0"}, {"OMP_NUM_THREADS": "x"}):
        assert training_threads(None, environ=unset) == cores
    assert training_threads(None, devices=2, environ={}) == max(1, cores // 2)
    assert training_threads(None, devices=4 * cores, environ={}) == 1  # never 0
    assert training_threads(None, devices="auto", environ={}) == cores  # one process
