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
    allocatable_with(
        vcpus,
        memory_mib,
        max_pods,
        ephemeral_gib,
        &Reservations::default(),
    )
}

/// Allocatable with what the user data sets: each resource of kube-reserved and each
/// eviction signal it names replaces the AMI's default for that one (the others keep
/// the default, so the template never promises more than a node whose setting was
/// read), and system-reserved comes off on top (the EKS AMIs set none).
pub fn allocatable_with(
    vcpus: i64,
    memory_mib: i64,
    max_pods: i64,
    ephemeral_gib: i64,
    r: &Reservations,
) -> Allocatable {
    let kube = &r.kube_reserved;
    let sys = &r.system_reserved;
    let cpu_reserved = kube
        .cpu_millis
        .unwrap_or_else(|| kube_reserved_cpu_millis(vcpus))
        .saturating_add(sys.cpu_millis.unwrap_or(0));
    let cpu = vcpus
        .saturating_mul(1000)
        .saturating_sub(cpu_reserved)
        .max(0);
    let memory_eviction = r
        .eviction_memory
        .map_or(EVICTION_MEMORY_MIB, |t| t.mib_of(memory_mib));
    let mem_reserved = kube
        .memory_mib
        .unwrap_or_else(|| kube_reserved_memory_mib(max_pods))
        .saturating_add(sys.memory_mib.unwrap_or(0))
        .saturating_add(memory_eviction);
    let mem = memory_mib.saturating_sub(mem_reserved).max(0);
    let eph_total = ephemeral_gib.max(0).saturating_mul(1024);
    let eph_eviction = match r.eviction_nodefs {
        Some(t) => t.mib_of(eph_total),
        None => (eph_total as f64 * EVICTION_NODEFS_FRACTION).ceil() as i64,
    };
    let eph_reserved = kube
        .ephemeral_mib
        .unwrap_or((RESERVED_EPHEMERAL_GIB * 1024.0) as i64)
        .saturating_add(sys.ephemeral_mib.unwrap_or(0))
        .saturating_add(eph_eviction);
    Allocatable {
        cpu_millis: cpu,
        memory_mib: mem,
        ephemeral_mib: eph_total.saturating_sub(eph_reserved).max(0),
    }
}

/// Reservations kubelet is told about in the user data (`--kube-reserved`,
/// `--system-reserved`, `--eviction-hard`, or their KubeletConfiguration and
/// Bottlerocket spellings). `None` keeps the AMI's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservations {
    pub kube_reserved: Reserved,
    pub system_reserved: Reserved,
    /// `memory.available`.
    pub eviction_memory: Option<Threshold>,
    /// `nodefs.available`.
    pub eviction_nodefs: Option<Threshold>,
}

impl Reservations {
    /// `other`'s settings over these, one by one.
    pub fn merge(&mut self, other: &Reservations) {
        self.kube_reserved.merge(&other.kube_reserved);
        self.system_reserved.merge(&other.system_reserved);
        self.eviction_memory = other.eviction_memory.or(self.eviction_memory);
        self.eviction_nodefs = other.eviction_nodefs.or(self.eviction_nodefs);
    }
}

impl Reserved {
    fn merge(&mut self, other: &Reserved) {
        self.cpu_millis = other.cpu_millis.or(self.cpu_millis);
        self.memory_mib = other.memory_mib.or(self.memory_mib);
        self.ephemeral_mib = other.ephemeral_mib.or(self.ephemeral_mib);
    }
}

/// One reservation map: `cpu`, `memory`, `ephemeral-storage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    pub cpu_millis: Option<i64>,
    pub memory_mib: Option<i64>,
    pub ephemeral_mib: Option<i64>,
}

/// An eviction threshold: a quantity or a percent of the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold {
    Mib(i64),
    /// Hundredths of a percent (10% is 1000).
    Percent(i64),
}

impl Threshold {
    /// The MiB this threshold keeps of `total_mib`, rounded up.
    pub fn mib_of(self, total_mib: i64) -> i64 {
        match self {
            Threshold::Mib(m) => m,
            Threshold::Percent(h) => {
                let v = i128::from(total_mib.max(0)) * i128::from(h);
                i64::try_from((v + 9_999) / 10_000).unwrap_or(i64::MAX)
            }
        }
    }
}

/// Largest quantity the parsers accept: 1 PiB of memory or storage, 100 000 cores.
pub const MAX_QUANTITY_BYTES: f64 = 1_125_899_906_842_624.0;
pub const MAX_CPU_MILLIS: i64 = 100_000_000;
/// Longest quantity string read.
const MAX_QUANTITY_CHARS: usize = 32;

/// A Kubernetes quantity as a plain number of base units (`250m` is 0.25, `1Gi` is
/// 1073741824, `1.5` is 1.5). None when it is not one (or is longer than 32 chars,
/// negative, NaN, or uses an exponent).
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    if q.is_empty() || q.len() > MAX_QUANTITY_CHARS {
        return None;
    }
    let num_end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let n: f64 = q[..num_end].parse().ok()?;
    let factor = match &q[num_end..] {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    let v = n * factor;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// A CPU quantity in millicores, rounded up; Err names why.
pub fn cpu_millis(q: &str) -> Result<i64, String> {
    let v = quantity(q).ok_or_else(|| "not a quantity".to_string())?;
    let m = (v * 1000.0).ceil();
    if m > MAX_CPU_MILLIS as f64 {
        return Err(format!("more than {} cores", MAX_CPU_MILLIS / 1000));
    }
    Ok(m as i64)
}

/// A memory or storage quantity in MiB, rounded up; Err names why.
pub fn quantity_mib(q: &str) -> Result<i64, String> {
    let v = quantity(q).ok_or_else(|| "not a quantity".to_string())?;
    if v > MAX_QUANTITY_BYTES {
        return Err("more than 1Pi".to_string());
    }
    Ok((v / (1024.0 * 1024.0)).ceil() as i64)
}

/// An eviction threshold: `100Mi` or `10%` (0 to 100, two decimals kept).
pub fn threshold(v: &str) -> Result<Threshold, String> {
    let v = v.trim();
    if let Some(p) = v.strip_suffix('%') {
        if p.len() > MAX_QUANTITY_CHARS {
            return Err("not a percent".into());
        }
        let pct: f64 = p.trim().parse().map_err(|_| "not a percent".to_string())?;
        if !(0.0..=100.0).contains(&pct) {
            return Err("a percent outside 0 to 100".into());
        }
        return Ok(Threshold::Percent((pct * 100.0).ceil() as i64));
    }
    quantity_mib(v).map(Threshold::Mib)
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
    fn reservations_replace_the_default_per_resource_and_system_reserved_adds() {
        let none = allocatable(2, 8192, 29, 20);
        assert_eq!(
            allocatable_with(2, 8192, 29, 20, &Reservations::default()),
            none
        );
        let r = Reservations {
            kube_reserved: Reserved {
                cpu_millis: Some(250),
                ..Reserved::default()
            },
            system_reserved: Reserved {
                cpu_millis: Some(100),
                memory_mib: Some(512),
                ephemeral_mib: Some(1024),
            },
            eviction_memory: Some(Threshold::Percent(500)),
            eviction_nodefs: Some(Threshold::Mib(2048)),
        };
        let a = allocatable_with(2, 8192, 29, 20, &r);
        assert_eq!(a.cpu_millis, 2000 - 250 - 100);
        // kube-reserved memory keeps its default (574), 512 system, 5 % of 8192.
        assert_eq!(a.memory_mib, 8192 - 574 - 512 - 410);
        assert_eq!(a.ephemeral_mib, 20 * 1024 - 1024 - 1024 - 2048);
        // Absurd reservations leave nothing, never a negative or a wrap.
        let huge = Reservations {
            system_reserved: Reserved {
                cpu_millis: Some(i64::MAX),
                memory_mib: Some(i64::MAX),
                ephemeral_mib: Some(i64::MAX),
            },
            ..Reservations::default()
        };
        let a = allocatable_with(2, 8192, 29, 20, &huge);
        assert_eq!((a.cpu_millis, a.memory_mib, a.ephemeral_mib), (0, 0, 0));
    }

    #[test]
    fn quantities_and_thresholds_parse_bounded() {
        assert_eq!(cpu_millis("250m"), Ok(250));
        assert_eq!(cpu_millis("1.5"), Ok(1500));
        assert_eq!(cpu_millis("0.0001"), Ok(1), "rounded up");
        assert_eq!(quantity_mib("1Gi"), Ok(1024));
        assert_eq!(quantity_mib("1G"), Ok(954));
        assert_eq!(quantity_mib("100Mi"), Ok(100));
        assert_eq!(quantity_mib("1"), Ok(1), "a byte is a MiB, rounded up");
        assert!(quantity_mib("2Pi").is_err());
        assert!(cpu_millis("200000").is_err());
        for bad in [
            "",
            "-1Gi",
            "1e3",
            "lots",
            "1Gb",
            "NaN",
            "1..2",
            &"9".repeat(40),
        ] {
            assert!(quantity(bad).is_none(), "{bad:?}");
        }
        assert_eq!(threshold("10%"), Ok(Threshold::Percent(1000)));
        assert_eq!(threshold("7.5%"), Ok(Threshold::Percent(750)));
        assert_eq!(threshold("500Mi"), Ok(Threshold::Mib(500)));
        assert!(threshold("101%").is_err());
        assert!(threshold("x%").is_err());
        assert_eq!(Threshold::Percent(1000).mib_of(20480), 2048);
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
