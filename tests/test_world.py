"""Which process speaks before MPI starts: the launcher's own rank variables decide."""

from __future__ import annotations

import pytest

from dlio_ckpt.world import launched_by_mpi, launcher_rank


@pytest.mark.parametrize("environ, rank", [
    ({}, 0),
    ({"PMI_RANK": "3"}, 3),                 # MPICH / Intel MPI (Hydra)
    ({"PMIX_RANK": "2"}, 2),                # PMIx launchers
    ({"OMPI_COMM_WORLD_RANK": "5"}, 5),     # Open MPI's mpirun
    ({"SLURM_PROCID": "7"}, 7),             # srun
    ({"PMI_RANK": ""}, 0),                  # set but empty: not a rank
])
def test_launcher_rank_reads_every_launchers_variable(environ, rank):
    assert launcher_rank(environ) == rank


def test_a_serial_environment_is_not_an_mpi_launch():
    assert not launched_by_mpi({})
    assert launched_by_mpi({"PMI_RANK": "0"})
    assert not launched_by_mpi({"PMI_RANK": "0", "DLIO_CKPT_SERIAL": "1"})
