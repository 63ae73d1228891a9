//! Where a benchmark run's CPU time went, from /proc (Linux only): the server child, the
//! bench's own clients, the rest of the machine (the database, when it runs here), and how busy
//! the machine was. A run that leaves cores idle waits on something serial, not on CPU.

/// CPU counters at one moment, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSample {
    machine_busy: u64,
    machine_total: u64,
    own: u64,
    server: Option<u64>,
}

/// The counters now; `None` where /proc cannot be read.
pub fn sample(server_pid: Option<u32>) -> Option<CpuSample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (machine_busy, machine_total) = machine_ticks(&stat)?;
    let own = process_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let server = server_pid
        .and_then(|pid| process_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?));
    Some(CpuSample {
        machine_busy,
        machine_total,
        own,
        server,
    })
}

/// One line on the CPU spent between `before` and `after`.
pub fn describe(before: CpuSample, after: CpuSample) -> Option<String> {
    let ticks_per_second = ticks_per_second()?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let seconds = |ticks: u64| ticks as f64 / ticks_per_second as f64;
    let busy = after.machine_busy.checked_sub(before.machine_busy)?;
    let total = after.machine_total.checked_sub(before.machine_total)?;
    let own = after.own.checked_sub(before.own)?;
    let server = match (before.server, after.server) {
        (Some(before), Some(after)) => after.checked_sub(before),
        _ => None,
    };
    let rest = busy.saturating_sub(own + server.unwrap_or(0));
    let server_part = server.map_or_else(String::new, |ticks| {
        format!("the server {:.2} s, ", seconds(ticks))
    });
    Some(format!(
        "CPU over the run: {server_part}the bench's clients {:.2} s, the rest of the machine \
         (the database, if it runs here) {:.2} s; the machine {:.0} % busy across {cores} cores",
        seconds(own),
        seconds(rest),
        100.0 * busy as f64 / total.max(1) as f64
    ))
}

/// The clock ticks /proc counts in a second.
fn ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0)
}

/// (busy, total) ticks of all cores from /proc/stat's first line.
fn machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal (guest time is counted in user already).
    let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = fields[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq + steal;
    Some((busy, busy + idle + iowait))
}

/// User and system ticks of a process from its /proc/PID/stat line.
fn process_ticks(stat: &str) -> Option<u64> {
    // The command name is in parentheses and may itself hold spaces and parentheses: the
    // fields are counted from the last `)`, where field 3 (the state) begins.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_ticks_count_busy_and_idle_time_of_all_cores() {
        let stat = "cpu  100 5 50 800 20 3 2 1 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\n";
        assert_eq!(machine_ticks(stat), Some((161, 981)));
        assert_eq!(machine_ticks("cpu0 1 2 3\n"), None);
        assert_eq!(machine_ticks("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(machine_ticks("cpu  1 2 3\n"), None);
    }

    #[test]
    fn process_ticks_are_user_and_system_time_whatever_the_command_name() {
        let fields = "S 1 2 3 4 5 6 7 8 9 10 170 19 0 0 20 0 12";
        assert_eq!(process_ticks(&format!("42 (sluice) {fields}")), Some(189));
        assert_eq!(process_ticks(&format!("42 (a b) c)) {fields}")), Some(189));
        assert_eq!(process_ticks("42 (sluice) S 1 2"), None);
        assert_eq!(process_ticks("no name at all"), None);
    }

    #[test]
    fn a_run_is_described_with_what_is_left_for_the_rest_of_the_machine() {
        let before = CpuSample {
            machine_busy: 1_000,
            machine_total: 2_000,
            own: 10,
            server: Some(100),
        };
        let after = CpuSample {
            machine_busy: 1_500,
            machine_total: 3_000,
            own: 50,
            server: Some(300),
        };
        let line = describe(before, after).unwrap();
        // 500 busy ticks of 1,000: 200 the server's, 40 the clients', 260 the rest's.
        let ticks = |t: f64| t / ticks_per_second().unwrap() as f64;
        assert!(
            line.contains(&format!("the server {:.2} s", ticks(200.0))),
            "{line}"
        );
        assert!(
            line.contains(&format!("clients {:.2} s", ticks(40.0))),
            "{line}"
        );
        assert!(
            line.contains(&format!("here) {:.2} s", ticks(260.0))),
            "{line}"
        );
        assert!(line.contains("50 % busy"), "{line}");
        let without_server = CpuSample {
            server: None,
            ..after
        };
        assert!(!describe(before, without_server).unwrap().contains("server"));
        assert_eq!(
            describe(after, before),
            None,
            "counters never run backwards"
        );
    }
}
