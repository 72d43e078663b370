"""How the docker runtime's disk quota is enforced on an engine, from ``docker info`` (plain data)."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.runtimes.docker_storage import full_places, quota_mode, quota_options
from prefect_rollouts.runtimes.docker_volumes import image_volumes, volume_mounts

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("driver", "backing", "mode"), [
    ("overlay2", "xfs", "size"), ("btrfs", "btrfs", "size"), ("zfs", "zfs", "size"),
    ("overlay2", "extfs", "tmpfs"), ("vfs", "extfs", "tmpfs"), ("fuse-overlayfs", "extfs", "tmpfs"),
])
def test_a_size_quota_where_the_storage_driver_takes_one_else_tmpfs(driver, backing, mode):
    info = {"Driver": driver, "DriverStatus": [["Backing Filesystem", backing], ["Supports d_type", "true"]]}
    assert quota_mode(info) == mode


def test_the_tmpfs_quota_makes_the_root_read_only_and_every_writable_place_a_sized_tmpfs():
    config = vf.RuntimeConfig(type="docker", storage_mb=100)
    options = quota_options(config, "tmpfs", "/root")
    assert options["read_only"] is True
    assert options["tmpfs"] == {p: "size=100m,exec" for p in ("/root", "/run", "/tmp", "/var/tmp")}
    [workspace] = options["mounts"]
    assert (workspace["Target"], workspace["Type"]) == ("/workspace", "volume")
    assert workspace["VolumeOptions"]["DriverConfig"]["Options"] == {"type": "tmpfs", "device": "tmpfs",
                                                                   "o": "size=100m"}
    assert quota_options(config, "size", "/root") == {"storage_opt": {"size": "100m"}}
    assert quota_options(config.model_copy(update={"storage_mb": 0}), "tmpfs", "/root") == {}


def test_a_filesystem_with_less_than_a_mib_free_is_full():
    df = ("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
          "tmpfs 65536 65532 4 100% /workspace\ntmpfs 65536 0 65536 0% /tmp\n")
    assert full_places(df) == ["/workspace"]


class Image:
    attrs = {"Config": {"Volumes": {"/var/lib/postgresql/data/": {}, "/tmp": {}, "/var/cache//app": {}, "/": {}}}}


@pytest.mark.parametrize(("storage_mb", "mode"), [(100, "tmpfs"), (100, "size"), (0, "tmpfs")])
def test_an_image_s_volumes_that_no_quota_place_covers_get_a_tmpfs_volume_of_storage_mb(storage_mb, mode):
    """Issue 32 (adversarial pass, e4): a VOLUME is an anonymous volume on the engine's disk otherwise."""
    config = vf.RuntimeConfig(type="docker", storage_mb=storage_mb)
    options = quota_options(config, mode, "/root")
    assert image_volumes(Image()) == ["/tmp", "/var/cache/app", "/var/lib/postgresql/data"]
    mounts = volume_mounts(config, Image(), options.get("mounts", []), options.get("tmpfs", {}))
    expected = {"tmpfs": ["/var/cache/app", "/var/lib/postgresql/data"],   # /tmp is the quota's own tmpfs already
                "size": ["/tmp", "/var/cache/app", "/var/lib/postgresql/data"]}[mode] if storage_mb else []
    assert [mount["Target"] for mount in mounts] == expected
    assert all(mount["VolumeOptions"]["DriverConfig"]["Options"] == {"type": "tmpfs", "device": "tmpfs",
                                                                     "o": "size=100m"} for mount in mounts)
