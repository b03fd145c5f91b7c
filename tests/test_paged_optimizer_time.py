"""The PCIe time of a paged bitsandbytes optimizer whose state does not fit beside the allocator's peak.

Each evicted byte is prefetched to the GPU for its own update (bnb ``prefetch_state`` -> cudaMemPrefetchAsync) and
written back to the host when the UVM driver evicts its chunk for the next prefetch; the driver pushes the two copies
on its CPU_TO_GPU and GPU_TO_CPU channels, separate copy engines, so over full-duplex PCIe they overlap: the step
pays the evicted bytes once at the link's one-way rate (techniques.json ``paged_pcie_passes``).
"""

from __future__ import annotations

import pytest

from perfguide.data.techniques import constant
from perfguide.techniques.optimizers import paged_seconds

PCIE = 25e9   # PCIe 4.0 x16 one way, perfguide's cc 8 figure (efficiency.json pcie_gbps_by_cc_major)


def test_the_evicted_state_crosses_once_in_time() -> None:
    assert constant("paged_pcie_passes") == 1
    # torchtune's Llama-3.1-8B 8-bit state (16.1 GB) with 1 GB free beside the allocator: 15.1 GB each way, overlapped
    assert paged_seconds(16_100_000_000, 1_000_000_000, PCIE) == pytest.approx(15.1e9 / 25e9)


def test_state_that_fits_pages_nothing_and_a_full_card_pages_it_all() -> None:
    assert paged_seconds(2_000_000_000, 3_000_000_000, PCIE) == 0
    assert paged_seconds(2_000_000_000, -5_000_000_000, PCIE) == pytest.approx(2e9 / 25e9)   # no room: every byte
