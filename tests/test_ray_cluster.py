"""tokenbatch.ray.pack on a simulated multi-node Ray cluster (``ray.cluster_utils``): exact
when a worker node is killed mid-run, and refused, with nothing left on any node, when
the nodes do not share the output."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import ray
from ray.cluster_utils import Cluster
from test_ray import MAX_TOKENS, assert_exactly_once, corpus, read_shards

import tokenbatch.ray as tb_ray

# Ray 2.52 leaves its log files and child processes to its own shutdown, which Python
# reports as resource warnings while the tests run.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head node without CPUs (the driver's) and two one-CPU worker nodes: every task
    runs on a node other than the driver's."""
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.data.DataContext.get_current().enable_progress_bars = False
    # Workers cannot import this test module: send its classes and functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _slowly(batch: pa.Table) -> pa.Table:
    time.sleep(0.3)  # keeps the run going long enough to lose a node in the middle of it
    return batch


def test_exact_when_a_worker_node_dies_mid_run(cluster: Cluster, tmp_path: Path) -> None:
    table = corpus(2_000)
    dataset = ray.data.from_arrow(table).repartition(16)
    dataset = dataset.map_batches(_slowly, batch_format="pyarrow", batch_size=None)
    output = tmp_path / "packed"
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(tb_ray.pack, dataset, MAX_TOKENS, output, oversize="split", num_shards=4)
        deadline = time.monotonic() + 120
        while not any(output.glob(".staging-*/*.parquet")) and not run.done():
            assert time.monotonic() < deadline, "no shard was ever written"
            time.sleep(0.05)
        assert not run.done(), "the run ended before a node could be lost"
        victim = next(node for node in cluster.worker_nodes)
        cluster.remove_node(victim, allow_graceful=False)
        manifest = run.result(timeout=300)
    cluster.add_node(num_cpus=1)  # back to two workers for the next test
    cluster.wait_for_nodes()
    assert sorted(p.name for p in output.iterdir()) == [
        "manifest.json",
        *(f"part-{i:05d}.parquet" for i in range(4)),
    ]
    shards = read_shards(manifest, lambda name: pq.read_table(output / name))
    assert_exactly_once(table, shards, manifest)


class NodeLocalDisk(pafs.FileSystemHandler):  # type: ignore[misc]
    """What a path means on a node without shared storage: each node reads and writes
    ``root/<its node id>/<path>``, so no node sees another's files."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _disk(self) -> pafs.FileSystem:
        base = f"{self.root}/{ray.get_runtime_context().get_node_id()}"
        Path(base).mkdir(parents=True, exist_ok=True)
        return pafs.SubTreeFileSystem(base, pafs.LocalFileSystem())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeLocalDisk) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    def get_type_name(self) -> str:
        return "node-local"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return self == other

    def get_file_info(self, paths: list[str]) -> Any:
        return self._disk().get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self._disk().get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._disk().create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._disk().delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._disk().delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self._disk().delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self._disk().delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._disk().move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self._disk().copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self._disk().open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self._disk().open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self._disk().open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self._disk().open_append_stream(path, metadata=metadata)


def test_unshared_output_is_refused_and_cleaned_on_every_node(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Each node writing to its own disk used to yield a manifest of what the driver saw."""
    disks = pafs.PyFileSystem(NodeLocalDisk(str(tmp_path)))
    dataset = ray.data.from_arrow(corpus(500)).repartition(4)
    with pytest.raises(tb_ray.PackingFailedError, match="output must be storage every node"):
        tb_ray.pack(dataset, MAX_TOKENS, "packed", filesystem=disks, num_shards=4)
    nodes = [path for path in tmp_path.iterdir() if path.is_dir()]
    assert len(nodes) >= 2, "the tasks and the driver wrote on different nodes"
    for node in nodes:
        left = [p for p in node.rglob("*") if p.is_file()]
        assert left == [], f"left behind on node {node.name}: {left}"
