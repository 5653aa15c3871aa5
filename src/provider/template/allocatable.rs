//! Allocatable the way the EKS AMIs configure kubelet, so a template never promises
//! room a real node will not have. Pure.

/// Max pods with the VPC CNI: ENIs x (IPv4 per ENI - 1) + 2 (host-network pods).
pub fn eni_max_pods(enis: i64, ipv4_per_eni: i64) -> Option<i64> {
    (enis > 0 && ipv4_per_eni > 1).then(|| enis * (ipv4_per_eni - 1) + 2)
}

/// kube-reserved CPU in millicores: 6% of the first core, 1% of the second, 0.5% of
/// the third and fourth, 0.25% of every core above four.
pub fn kube_reserved_cpu_millis(vcpus: i64) -> i64 {
    let mut reserved: f64 = 0.0;
    for core in 1..=vcpus.max(0) {
        reserved += match core {
            1 => 60.0,
            2 => 10.0,
            3 | 4 => 5.0,
            _ => 2.5,
        };
    }
    reserved.round() as i64
}

/// kube-reserved memory in MiB: 11 MiB per pod + 255 MiB.
pub fn kube_reserved_memory_mib(max_pods: i64) -> i64 {
    11 * max_pods.max(0) + 255
}

/// The share of an instance type's nominal memory (DescribeInstanceTypes'
/// `MemoryInfo.SizeInMiB`) that the guest never sees as `MemTotal`: firmware,
/// hypervisor, kernel reservations. Karpenter's default for the same allowance is
/// 0.075 (a fraction, its flag `--vm-memory-overhead-percent`, env
/// `VM_MEMORY_OVERHEAD_PERCENT`): aws/karpenter-provider-aws
/// pkg/operator/options/options.go (AddFlags), applied in
/// pkg/providers/instancetype/types.go (`memory`: rounded up to whole MiB and taken
/// off the capacity before kube-reserved). Here the setting is a percent: 7.5.
pub const DEFAULT_VM_MEMORY_OVERHEAD_PERCENT: f64 = 7.5;
/// The highest overhead percent the config accepts: more would be a typo (0.075 of
/// Karpenter's fraction written as 75, say), not a VM.
pub const MAX_VM_MEMORY_OVERHEAD_PERCENT: f64 = 50.0;
/// Graviton (arm64) instances keep 64 MiB for the kernel's contiguous memory
/// allocator that pods cannot use (same Karpenter file, `memory`).
pub const ARM64_CMA_MIB: i64 = 64;

/// The MiB the VM overhead takes from `nominal_mib`: `percent` of it, rounded up.
/// A percent outside 0..=MAX (or NaN) is read as the default: the config refuses
/// those, and a pure function must not promise more than the default would.
pub fn vm_overhead_mib(nominal_mib: i64, percent: f64) -> i64 {
    let pct = if (0.0..=MAX_VM_MEMORY_OVERHEAD_PERCENT).contains(&percent) {
        percent
    } else {
        DEFAULT_VM_MEMORY_OVERHEAD_PERCENT
    };
    let nominal = nominal_mib.max(0);
    // Integer arithmetic in hundredths of a percent: exact for every config value
    // with two decimals, no float rounding up or down a MiB.
    let hundredths = (pct * 100.0).round() as i64;
    let num = i128::from(nominal) * i128::from(hundredths);
    let mib = (num + 9_999) / 10_000;
    i64::try_from(mib).unwrap_or(nominal).min(nominal)
}

/// Memory a node of the type has as capacity (what kubelet reports as
/// `status.capacity.memory`, near `MemTotal`): nominal less the VM overhead, and
/// less the CMA reservation on arm64. Never negative.
pub fn memory_capacity_mib(nominal_mib: i64, architecture: &str, overhead_percent: f64) -> i64 {
    let cma = if architecture == "arm64" {
        ARM64_CMA_MIB
    } else {
        0
    };
    let after_cma = (nominal_mib.max(0) - cma).max(0);
    (after_cma - vm_overhead_mib(after_cma, overhead_percent)).max(0)
}

/// kubelet's eviction-hard `memory.available<100Mi`.
pub const EVICTION_MEMORY_MIB: i64 = 100;
/// Ephemeral storage: 1 GiB kube-reserved plus eviction at 10% of the filesystem.
pub const RESERVED_EPHEMERAL_GIB: f64 = 1.0;
pub const EVICTION_NODEFS_FRACTION: f64 = 0.10;

/// Allocatable numbers for a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu_millis: i64,
    pub memory_mib: i64,
    pub ephemeral_mib: i64,
}

pub fn allocatable(vcpus: i64, memory_mib: i64, max_pods: i64, ephemeral_gib: i64) -> Allocatable {
    let cpu = (vcpus * 1000 - kube_reserved_cpu_millis(vcpus)).max(0);
    let mem = (memory_mib - kube_reserved_memory_mib(max_pods) - EVICTION_MEMORY_MIB).max(0);
    let eph_total = ephemeral_gib as f64 * 1024.0;
    let eph =
        (eph_total * (1.0 - EVICTION_NODEFS_FRACTION) - RESERVED_EPHEMERAL_GIB * 1024.0).max(0.0);
    Allocatable {
        cpu_millis: cpu,
        memory_mib: mem,
        ephemeral_mib: eph.floor() as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m5_large_numbers() {
        // 2 vCPU, 8 GiB, 3 ENIs x 10 IPv4.
        let pods = eni_max_pods(3, 10).unwrap();
        assert_eq!(pods, 29);
        assert_eq!(kube_reserved_cpu_millis(2), 70);
        assert_eq!(kube_reserved_memory_mib(29), 574);
        let a = allocatable(2, 8192, pods, 20);
        assert_eq!(a.cpu_millis, 1930);
        assert_eq!(a.memory_mib, 8192 - 574 - 100);
        assert_eq!(a.ephemeral_mib, (20.0 * 1024.0 * 0.9 - 1024.0) as i64);
    }

    #[test]
    fn vm_overhead_is_rounded_up_and_bounded() {
        // Karpenter's example: 7.5 % of m5.large's 8192 MiB is 614.4, so 615.
        assert_eq!(vm_overhead_mib(8192, 7.5), 615);
        assert_eq!(vm_overhead_mib(8192, 0.0), 0);
        assert_eq!(vm_overhead_mib(1, 7.5), 1);
        assert_eq!(vm_overhead_mib(0, 7.5), 0);
        assert_eq!(vm_overhead_mib(-5, 7.5), 0);
        assert_eq!(vm_overhead_mib(1000, 50.0), 500);
        // Out of range or NaN: the default, never less.
        for odd in [
            -1.0,
            50.01,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
        ] {
            assert_eq!(vm_overhead_mib(8192, odd), 615, "{odd}");
        }
        // No overflow on absurd sizes: half of i64::MAX, rounded up.
        assert_eq!(vm_overhead_mib(i64::MAX, 50.0), i64::MAX / 2 + 1);
        assert_eq!(memory_capacity_mib(8192, "amd64", 7.5), 8192 - 615);
        // Graviton: 64 MiB of CMA first, then 7.5 % of the rest (8128 -> 610).
        assert_eq!(memory_capacity_mib(8192, "arm64", 7.5), 8128 - 610);
        assert_eq!(memory_capacity_mib(10, "arm64", 7.5), 0);
    }

    #[test]
    fn cpu_tiers() {
        assert_eq!(kube_reserved_cpu_millis(1), 60);
        assert_eq!(kube_reserved_cpu_millis(4), 80);
        assert_eq!(kube_reserved_cpu_millis(8), 90);
        assert_eq!(kube_reserved_cpu_millis(96), 80 + 92 * 5 / 2);
        assert_eq!(kube_reserved_cpu_millis(0), 0);
    }

    #[test]
    fn never_negative_and_unknown_enis() {
        let a = allocatable(0, 100, 110, 0);
        assert_eq!((a.cpu_millis, a.memory_mib, a.ephemeral_mib), (0, 0, 0));
        assert_eq!(eni_max_pods(0, 10), None);
        assert_eq!(eni_max_pods(3, 1), None);
    }
}
