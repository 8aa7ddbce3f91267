-- How each profile's machines are prepared (C). A GB10 Spark: LXD from the snap, a zfs
-- pool, the ARC capped, lofispark-base from Ubuntu 24.04. The staff-only test profile
-- names the alternatives a Debian container can do: Debian's LXD, a dir pool, a busybox
-- image built on the host, no operator tunnel (cloudflared is in no registry a test host
-- reaches); preparation says so in its report.
update host_profiles set constants = json_set(constants, '$.prepare', json('{"lxd": "snap", "storage_driver": "zfs", "pool_size": "200GiB", "zfs_arc_max": 8589934592, "base_image": "ubuntu"}'))
 where id in ('gb10-spark-1', 'gb10-spark-2', 'gb10-spark-4');
update host_profiles set constants = json_set(constants, '$.prepare', json('{"lxd": "apt", "storage_driver": "dir", "pool_size": "20GiB", "zfs_arc_max": 1073741824, "base_image": "minimal", "tunnel": false}'))
 where id = 'linux-test';
