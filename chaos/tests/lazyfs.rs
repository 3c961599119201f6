//! The lazy filesystem on a real FUSE mount in a temporary directory: what survives a power
//! loss is exactly what was fsynced, file data by the file's `fsync`, names by their
//! directory's. Each test unmounts at its end and checks the mount is gone from /proc/mounts
//! (a panicking test unmounts on drop). Without /dev/fuse (or, when not root, fusermount3) the
//! tests are skipped, and fail under CI=true, saying what to install.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tarq_chaos::lazyfs::{LazyFs, Lost};
use tempfile::TempDir;

/// A mount over a fresh backing directory, both in one temporary directory.
struct Mounted {
    // Declared first, so dropped (unmounted) before the directory is removed.
    fs: Option<LazyFs>,
    backing: PathBuf,
    mnt: PathBuf,
    _tmp: TempDir,
}

impl Mounted {
    fn at(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    fn lose(&self) -> Lost {
        self.fs
            .as_ref()
            .expect("mounted")
            .lose_unsynced()
            .expect("lose")
    }

    /// Unmounts and checks the kernel no longer lists the mount.
    fn finish(mut self) {
        let mnt = self.mnt.clone();
        self.fs.take().expect("mounted").unmount().expect("unmount");
        assert!(!mounted_at(&mnt), "{} still in /proc/mounts", mnt.display());
    }
}

/// Mounts a lazy filesystem, or says why the test is skipped (`None`).
fn mount() -> Option<Mounted> {
    if let Some(missing) = missing_fuse() {
        let how = "install Debian's fuse3 (fusermount3) and give the machine /dev/fuse \
                   (`modprobe fuse`; in a container, --device /dev/fuse --cap-add SYS_ADMIN)";
        if tarq_testkit::reference::ci() {
            panic!("{missing}: {how} (CI=true: the FUSE tests are required)");
        }
        tarq_testkit::reference::skip(&format!("{missing}: {how}"));
        return None;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let (backing, mnt) = (tmp.path().join("backing"), tmp.path().join("mnt"));
    fs::create_dir(&backing).expect("backing dir");
    fs::create_dir(&mnt).expect("mountpoint");
    let fs = LazyFs::mount(&backing, &mnt).expect("mount");
    let mnt = fs.mountpoint().to_path_buf();
    assert!(mounted_at(&mnt), "{} not in /proc/mounts", mnt.display());
    Some(Mounted {
        fs: Some(fs),
        backing,
        mnt,
        _tmp: tmp,
    })
}

/// What the mount needs and is not here: /dev/fuse always; fusermount3 when not root (root
/// mounts and unmounts with the system calls themselves).
fn missing_fuse() -> Option<&'static str> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing");
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let fusermount = std::env::split_paths(&path).any(|d| d.join("fusermount3").is_file());
    if !fusermount && !rustix::process::geteuid().is_root() {
        return Some("fusermount3 is missing (needed when not root)");
    }
    None
}

/// Whether /proc/mounts lists a mount at `mnt` (its octal escapes undone).
fn mounted_at(mnt: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    let want = mnt.to_str().expect("a UTF-8 temporary path");
    mounts.lines().any(|line| {
        let target = line.split(' ').nth(1).unwrap_or_default();
        target.replace("\\040", " ").replace("\\011", "\t") == want
    })
}

fn fsync_dir(dir: &Path) {
    File::open(dir)
        .expect("open dir")
        .sync_all()
        .expect("fsync dir");
}

/// Creates `path` with `data`, fsyncs it, and fsyncs its directory: all of it durable.
fn durable_file(path: &Path, data: &[u8]) {
    let mut f = File::create(path).expect("create");
    f.write_all(data).expect("write");
    f.sync_all().expect("fsync");
    fsync_dir(path.parent().expect("a parent"));
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("UTF-8"))
        .collect();
    names.sort();
    names
}

/// `n` bytes that differ from one offset to the next and from one `seed` to another.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_fsynced_write_survives_a_power_loss_and_an_unsynced_one_is_gone() {
    let Some(m) = mount() else { return };
    durable_file(&m.at("synced"), b"made durable");
    // Its name is durable, its data never was: it comes back empty.
    File::create(m.at("named")).expect("create");
    fsync_dir(&m.mnt);
    fs::write(m.at("named"), b"never fsynced").expect("write");
    // Neither its name nor its data was made durable: gone.
    fs::write(m.at("unnamed"), b"never fsynced").expect("write");

    let lost = m.lose();

    assert_eq!(lost, Lost { files: 2, names: 1 });
    assert_eq!(read(&m.at("synced")), b"made durable");
    assert_eq!(read(&m.at("named")), b"");
    assert!(!m.at("unnamed").exists());
    assert_eq!(names(&m.mnt), ["named", "synced"]);
    // The backing directory holds just that: no trash, nothing else.
    assert_eq!(names(&m.backing), ["named", "synced"]);
    assert_eq!(read(&m.backing.join("synced")), b"made durable");
    m.finish();
}

#[test]
fn an_append_after_fsync_leaves_only_the_fsynced_prefix() {
    let Some(m) = mount() else { return };
    let durable = pattern(10_000, 1);
    durable_file(&m.at("log"), &durable);
    let mut f = OpenOptions::new().append(true).open(m.at("log")).unwrap();
    f.write_all(&pattern(5_000, 2)).expect("append");
    // An overwrite inside the durable part, across a page boundary, is taken back too.
    let rw = OpenOptions::new().write(true).open(m.at("log")).unwrap();
    rw.write_all_at(&[0xEE; 300], 4_000).expect("overwrite");
    drop((f, rw));
    assert_eq!(read(&m.at("log")).len(), 15_000);

    m.lose();

    assert_eq!(read(&m.at("log")), durable);
    m.finish();
}

#[test]
fn a_truncate_without_fsync_is_undone_and_with_fsync_kept() {
    let Some(m) = mount() else { return };
    let durable = pattern(10_000, 3);
    durable_file(&m.at("undone"), &durable);
    durable_file(&m.at("kept"), &durable);
    let f = OpenOptions::new().write(true).open(m.at("undone")).unwrap();
    f.set_len(100).expect("truncate");
    // Then grown again with new bytes past the cut: all of it is taken back.
    f.write_all_at(b"new bytes", 5_000).expect("write");
    drop(f);
    let f = OpenOptions::new().write(true).open(m.at("kept")).unwrap();
    f.set_len(100).expect("truncate");
    f.sync_all().expect("fsync");
    drop(f);

    m.lose();

    assert_eq!(read(&m.at("undone")), durable);
    assert_eq!(read(&m.at("kept")), &durable[..100]);
    m.finish();
}

/// A file opened with `O_DSYNC` has each write durable when it returns.
#[test]
fn writes_through_an_o_dsync_descriptor_need_no_fsync() {
    use std::os::unix::fs::OpenOptionsExt;
    let Some(m) = mount() else { return };
    durable_file(&m.at("dsync"), b"");
    let mut f = OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_DSYNC)
        .open(m.at("dsync"))
        .expect("open O_DSYNC");
    f.write_all(b"durable at once").expect("write");
    drop(f);

    m.lose();

    assert_eq!(read(&m.at("dsync")), b"durable at once");
    m.finish();
}

/// The model: a file's fsync makes its data durable, not its name, which needs its directory
/// fsynced. A file created and fsynced in a directory never fsynced is gone after the loss.
#[test]
fn a_created_and_fsynced_file_whose_directory_was_not_fsynced_is_gone() {
    let Some(m) = mount() else { return };
    let mut f = File::create(m.at("orphan")).expect("create");
    f.write_all(b"fsynced data").expect("write");
    f.sync_all().expect("fsync the file only");
    drop(f);

    m.lose();

    assert!(!m.at("orphan").exists());
    assert!(names(&m.backing).is_empty(), "{:?}", names(&m.backing));
    m.finish();
}

/// The snapshot pattern: write a temporary file, fsync it, rename it over the old snapshot,
/// fsync the directory.
fn replace_snapshot(m: &Mounted, data: &[u8], sync_dir: bool) {
    let mut tmp = File::create(m.at("snap.tmp")).expect("create tmp");
    tmp.write_all(data).expect("write tmp");
    tmp.sync_all().expect("fsync tmp");
    drop(tmp);
    fs::rename(m.at("snap.tmp"), m.at("snap")).expect("rename");
    if sync_dir {
        fsync_dir(&m.mnt);
    }
}

#[test]
fn a_snapshot_renamed_into_place_survives_once_its_directory_is_fsynced() {
    let Some(m) = mount() else { return };
    durable_file(&m.at("snap"), b"old snapshot");
    replace_snapshot(&m, b"new snapshot", true);

    let lost = m.lose();

    assert_eq!(lost, Lost::default());
    assert_eq!(read(&m.at("snap")), b"new snapshot");
    assert_eq!(names(&m.backing), ["snap"]);
    m.finish();
}

#[test]
fn a_snapshot_renamed_into_place_reverts_to_the_old_one_without_the_directory_fsync() {
    let Some(m) = mount() else { return };
    durable_file(&m.at("snap"), b"old snapshot");
    replace_snapshot(&m, b"new snapshot", false);
    assert_eq!(read(&m.at("snap")), b"new snapshot");
    // The trash where the old snapshot waits is not part of what the mount shows.
    assert_eq!(names(&m.mnt), ["snap"]);

    let lost = m.lose();

    assert_eq!(lost.names, 2, "the create of snap.tmp and the rename");
    assert_eq!(read(&m.at("snap")), b"old snapshot");
    assert_eq!(names(&m.mnt), ["snap"]);
    assert_eq!(names(&m.backing), ["snap"]);
    m.finish();
}

#[test]
fn an_unlink_is_undone_without_the_directory_fsync_and_kept_with_it() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.at("a")).expect("mkdir a");
    fs::create_dir(m.at("b")).expect("mkdir b");
    fsync_dir(&m.mnt);
    durable_file(&m.at("a/segment"), b"segment a");
    durable_file(&m.at("b/segment"), b"segment b");
    fs::remove_file(m.at("a/segment")).expect("unlink a");
    fs::remove_file(m.at("b/segment")).expect("unlink b");
    fsync_dir(&m.at("b"));

    m.lose();

    assert_eq!(read(&m.at("a/segment")), b"segment a");
    assert!(!m.at("b/segment").exists());
    assert_eq!(names(&m.backing), ["a", "b"]);
    m.finish();
}

/// A new directory is durable once its parent is fsynced; until then its whole content goes
/// with it, even what was fsynced inside it.
#[test]
fn a_directory_whose_parent_was_not_fsynced_is_gone_with_its_content() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.at("kept")).expect("mkdir");
    fsync_dir(&m.mnt);
    fs::create_dir(m.at("gone")).expect("mkdir");
    durable_file(&m.at("gone/file"), b"fsynced, and its directory too");
    durable_file(&m.at("kept/file"), b"fsynced, and its directory too");

    m.lose();

    assert_eq!(names(&m.mnt), ["kept"]);
    assert_eq!(read(&m.at("kept/file")), b"fsynced, and its directory too");
    m.finish();
}

/// A rename between directories is one operation: the fsync of either directory makes it
/// durable, so the file is in exactly one of them after the loss.
#[test]
fn a_rename_across_directories_is_durable_through_either_directory() {
    let Some(m) = mount() else { return };
    for d in ["from", "to"] {
        fs::create_dir(m.at(d)).expect("mkdir");
    }
    fsync_dir(&m.mnt);
    durable_file(&m.at("from/one"), b"one");
    durable_file(&m.at("from/two"), b"two");
    durable_file(&m.at("from/three"), b"three");
    fs::rename(m.at("from/one"), m.at("to/one")).expect("rename one");
    fs::rename(m.at("from/two"), m.at("to/two")).expect("rename two");
    fsync_dir(&m.at("from"));
    fs::rename(m.at("from/three"), m.at("to/three")).expect("rename three");
    fsync_dir(&m.at("to"));
    fs::rename(m.at("to/one"), m.at("from/one")).expect("rename one back");

    m.lose();

    assert_eq!(names(&m.at("from")), Vec::<String>::new());
    assert_eq!(names(&m.at("to")), ["one", "three", "two"]);
    assert_eq!(read(&m.at("to/one")), b"one");
    m.finish();
}

/// A writer doing many small writes, fsyncing now and then, stopped between two fsyncs: what
/// is left is exactly what it had written up to its last fsync.
#[test]
fn a_writer_keeps_exactly_what_it_wrote_up_to_its_last_fsync() {
    let Some(m) = mount() else { return };
    durable_file(&m.at("wal"), b"");
    let path = m.at("wal");
    let writer = std::thread::spawn(move || {
        let mut f = OpenOptions::new().append(true).open(path).expect("open");
        let (mut written, mut synced) = (Vec::new(), 0);
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        for i in 0..3_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let record = pattern(1 + (rng % 300) as usize, i as u8);
            f.write_all(&record).expect("write");
            written.extend_from_slice(&record);
            if rng.is_multiple_of(23) {
                f.sync_data().expect("fdatasync");
                synced = written.len();
            }
        }
        assert!(synced > 0 && synced < written.len(), "ends between fsyncs");
        (written, synced)
    });
    let (written, synced) = writer.join().expect("the writer");
    assert_eq!(read(&m.at("wal")), written);

    m.lose();

    let left = read(&m.at("wal"));
    assert_eq!(left.len(), synced);
    assert!(
        left == written[..synced],
        "the content differs from the fsynced prefix"
    );
    m.finish();
}

/// Kills its process group on drop, so a failing test leaves no writer behind.
struct Killed(Child);

impl Killed {
    fn kill(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.0);
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real program killed with SIGKILL mid-run: a shell appends numbered lines and runs
/// `sync FILE` (an fsync) every tenth line, noting outside the mount which line it had synced.
/// After the loss the file is lines 1..k, with k a multiple of ten: at least the last noted,
/// and at most the one sync it may have finished before the kill stopped it noting it.
#[test]
fn a_killed_shell_keeps_its_lines_up_to_its_last_sync() {
    let Some(m) = mount() else { return };
    let (file, progress) = (m.at("lines"), m.backing.with_file_name("progress"));
    durable_file(&file, b"");
    let script = r#"i=0
        while [ "$i" -lt 100000 ]; do
          i=$((i + 1))
          echo "line $i" >> "$1"
          if [ $((i % 10)) -eq 0 ]; then sync "$1"; echo "$i" > "$2.tmp"; mv "$2.tmp" "$2"; fi
        done"#;
    let child = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(&file)
        .arg(&progress)
        .process_group(0)
        .spawn()
        .expect("sh");
    let mut shell = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while noted(&progress) < 200 {
        assert!(Instant::now() < deadline, "the shell synced too few lines");
        std::thread::sleep(Duration::from_millis(20));
    }
    shell.kill();
    let noted = noted(&progress);

    m.lose();

    let left = String::from_utf8(read(&file)).expect("text");
    let lines: Vec<&str> = left.lines().collect();
    let k = lines.len();
    assert!(
        k.is_multiple_of(10) && k >= noted && k <= noted + 10,
        "{k} lines, {noted} noted"
    );
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(*line, format!("line {}", i + 1));
    }
    assert!(left.ends_with('\n'));
    m.finish();
}

/// The last line number the shell noted as synced, 0 before the first.
fn noted(progress: &Path) -> usize {
    let mut text = String::new();
    if let Ok(mut f) = File::open(progress) {
        let _ = f.read_to_string(&mut text);
    }
    text.trim().parse().unwrap_or(0)
}

#[test]
fn a_busy_mount_is_unmounted_lazily() {
    let Some(mut m) = mount() else { return };
    durable_file(&m.at("open"), b"held open");
    let mut held = File::open(m.at("open")).expect("open");
    let mnt = m.mnt.clone();
    m.fs.take().expect("mounted").unmount().expect("unmount");
    assert!(!mounted_at(&mnt), "{} still in /proc/mounts", mnt.display());
    // Served still, until closed.
    let mut text = String::new();
    held.read_to_string(&mut text)
        .expect("read after the unmount");
    assert_eq!(text, "held open");
}

#[test]
fn a_power_loss_waits_for_open_files_and_fails_if_they_stay_open() {
    let Some(m) = mount() else { return };
    let held = File::create(m.at("held")).expect("create");
    let err = m.fs.as_ref().unwrap().lose_unsynced().unwrap_err();
    assert!(format!("{err}").contains("still open"), "{err}");
    drop(held);
    m.lose();
    assert!(!m.at("held").exists());
    m.finish();
}

#[test]
fn an_rmdir_and_a_symlink_follow_their_directory_fsync() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.at("removed")).expect("mkdir");
    fsync_dir(&m.mnt);
    fs::remove_dir(m.at("removed")).expect("rmdir");
    std::os::unix::fs::symlink("target one", m.at("kept link")).expect("symlink");
    fsync_dir(&m.mnt);
    fs::create_dir(m.at("again")).expect("mkdir");
    fsync_dir(&m.mnt);
    fs::remove_dir(m.at("again")).expect("rmdir");
    std::os::unix::fs::symlink("target two", m.at("lost link")).expect("symlink");

    m.lose();

    assert_eq!(names(&m.mnt), ["again", "kept link"]);
    let target = fs::read_link(m.at("kept link")).expect("readlink");
    assert_eq!(target, Path::new("target one"));
    m.finish();
}

/// The WAL's way: space given ahead with `fallocate(FALLOC_FL_KEEP_SIZE)`, then appends.
#[test]
fn appends_into_preallocated_space_are_cut_back_to_the_fsynced_length() {
    let Some(m) = mount() else { return };
    durable_file(&m.at("segment"), b"");
    let mut f = OpenOptions::new()
        .append(true)
        .open(m.at("segment"))
        .unwrap();
    let keep = rustix::fs::FallocateFlags::KEEP_SIZE;
    rustix::fs::fallocate(&f, keep, 0, 1 << 20).expect("fallocate");
    f.write_all(&pattern(6_000, 4)).expect("append");
    f.sync_data().expect("fdatasync");
    f.write_all(&pattern(6_000, 5)).expect("append");
    drop(f);

    m.lose();

    assert_eq!(read(&m.at("segment")), pattern(6_000, 4));
    m.finish();
}

/// `LazyFs` is handed to the nemesis's thread.
#[test]
fn a_mount_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<LazyFs>();
}

/// The server itself on the mount: with `--wal-mode fsync` every put it acknowledged is there
/// after a power loss; with `--wal-mode write` (durable against a crash of the process only)
/// the loss takes some back, which is what the mount is for. tarq makes its data directory
/// itself, two levels deep: it must fsync the parents of what it creates, or the power loss
/// takes the whole directory back (it did: all 100 puts gone with `fsync`).
#[test]
fn tarq_keeps_every_acknowledged_put_through_a_power_loss_only_with_wal_mode_fsync() {
    let tarq = match tarq_chaos::procs::tarq_bin() {
        Ok(bin) => bin,
        Err(e) if tarq_testkit::reference::ci() => panic!("{e:#} (CI=true: nothing skipped)"),
        Err(e) => return tarq_testkit::reference::skip(&format!("{e:#}")),
    };
    let Some(m) = mount() else { return };
    const PUTS: usize = 100;
    for (mode, all_kept) in [("fsync", true), ("write", false)] {
        let data = m.at(mode).join("data");
        let mut server = Tarq::start(&tarq, &data, mode);
        for i in 0..PUTS {
            let body = format!("job {i}");
            let put = format!("put 0 0 60 {}\r\n{body}\r\n", body.len());
            let answer = server.ask(&put);
            assert!(answer.starts_with("INSERTED "), "{answer}");
        }
        server.process.kill();
        m.lose();
        let ready = Tarq::start(&tarq, &data, mode).ready_jobs();
        match all_kept {
            true => assert_eq!(ready, PUTS, "wal-mode {mode}"),
            false => assert!(ready < PUTS, "wal-mode {mode}: {ready} kept"),
        }
    }
    m.finish();
}

/// A tarq serving the beanstalk protocol on a data directory, killed on drop.
struct Tarq {
    process: Killed,
    conn: std::io::BufReader<std::net::TcpStream>,
}

impl Tarq {
    fn start(bin: &Path, data: &Path, wal_mode: &str) -> Tarq {
        // Held for the server, which binds it with SO_REUSEADDR: no other process gets it.
        let held = tarq_testkit::ports::Refusing::reserve();
        let port = held.addr.port();
        let child = Command::new(bin)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--wal-mode",
                wal_mode,
                "--data-dir",
            ])
            .arg(data)
            .args(["--beanstalk-listen", &format!("127.0.0.1:{port}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .expect("tarq starts");
        let mut process = Killed(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let conn = loop {
            if let Ok(conn) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                break conn;
            }
            let exited = process.0.try_wait().expect("try_wait");
            assert!(exited.is_none(), "tarq exited: {exited:?}");
            assert!(Instant::now() < deadline, "tarq did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        };
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let conn = std::io::BufReader::new(conn);
        drop(held);
        Tarq { process, conn }
    }

    /// Sends `request`, answers its first line.
    fn ask(&mut self, request: &str) -> String {
        use std::io::BufRead;
        self.conn
            .get_mut()
            .write_all(request.as_bytes())
            .expect("send");
        let mut line = String::new();
        self.conn.read_line(&mut line).expect("an answer");
        line
    }

    /// `current-jobs-ready` of `stats`.
    fn ready_jobs(mut self) -> usize {
        let head = self.ask("stats\r\n");
        let len: usize = head
            .trim()
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("stats answered {head:?}"));
        let mut body = vec![0; len + 2];
        self.conn.read_exact(&mut body).expect("the stats");
        let body = String::from_utf8(body).expect("text");
        let line = body
            .lines()
            .find_map(|l| l.strip_prefix("current-jobs-ready: "))
            .unwrap_or_else(|| panic!("no current-jobs-ready in {body}"));
        line.trim().parse().expect("a count")
    }
}
