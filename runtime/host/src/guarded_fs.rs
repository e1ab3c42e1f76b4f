//! `wasi:filesystem/types` as wasmtime-wasi implements it, with one change: a plugin
//! cannot open anything but a regular file or a directory.
//!
//! Opening a FIFO for reading blocks until a writer appears, in the host, on the call's
//! thread, where neither the epoch deadline nor the capped clock can reach it: a named
//! pipe in a granted directory hung the run for ever. Devices are no better (a tty, a
//! tape, `/dev/zero` read to the end). So `open-at` first asks what the path names (with
//! the same symlink rule as the open) and refuses a FIFO, socket, character or block
//! device with `not-permitted`, before wasmtime-wasi opens anything. The check and the
//! open are two steps; the plugin itself is single-threaded and waits in this call, so
//! only another process writing into the granted directory between them could swap the
//! file (see docs/security.md).
//!
//! It also records which filesystem grant each path operation used (`used`, for
//! `kubectl bosun plugin test`): every descriptor is traced back to the preopen it
//! descends from. Otherwise every function is wasmtime-wasi's own, called unchanged.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::bindings::sync::filesystem::types as fs;
use wasmtime_wasi::p2::bindings::sync::io::streams;
use wasmtime_wasi::p2::{FsError, FsResult};

/// The `HasData` marker of [`GuardedFs`].
pub(crate) struct GuardedFilesystem;

impl HasData for GuardedFilesystem {
    type Data<'a> = GuardedFs<'a>;
}

/// wasmtime-wasi's filesystem view with the open check, and the call's refusals, where an
/// open refused for a symlink leading out of its grant is explained.
pub(crate) struct GuardedFs<'a> {
    pub fs: WasiFilesystemCtxView<'a>,
    pub denied: &'a mut Vec<crate::report::Denial>,
    /// The grant (guest path) of each open descriptor, by resource index.
    pub descriptors: &'a mut HashMap<u32, Arc<str>>,
    pub used: &'a mut BTreeSet<crate::GrantUse>,
}

/// Whether a plugin may open a file of this type.
pub(crate) fn openable(t: fs::DescriptorType) -> bool {
    matches!(
        t,
        fs::DescriptorType::RegularFile
            | fs::DescriptorType::Directory
            | fs::DescriptorType::SymbolicLink
    )
}

impl GuardedFs<'_> {
    /// Records a path operation through descriptor `rep` as a use of its grant.
    fn touch(&mut self, rep: u32) {
        if let Some(grant) = self.descriptors.get(&rep) {
            self.used
                .insert(crate::GrantUse::Filesystem(grant.to_string()));
        }
    }

    /// Why opening `path` beneath the directory `dir` was refused when a component of it is
    /// a symlink whose target leads out of the directory (an absolute target, or more `..`
    /// than the link is deep): wasmtime-wasi never follows such a link, and the plugin only
    /// sees "not permitted". `None` when no component is such a link.
    fn symlink_out_of_grant(
        &mut self,
        dir: Resource<fs::Descriptor>,
        path: &str,
    ) -> Option<String> {
        let mut prefix = String::new();
        for (depth, part) in path
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .enumerate()
        {
            if part == ".." {
                return None;
            }
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            let probe = Resource::<fs::Descriptor>::new_borrow(dir.rep());
            let stat = fs::HostDescriptor::stat_at(
                &mut self.fs,
                probe,
                fs::PathFlags::empty(),
                prefix.clone(),
            )
            .ok()?;
            if stat.type_ == fs::DescriptorType::SymbolicLink {
                let probe = Resource::<fs::Descriptor>::new_borrow(dir.rep());
                let target =
                    fs::HostDescriptor::readlink_at(&mut self.fs, probe, prefix.clone()).ok()?;
                let mut level = depth;
                let mut leaves = target.starts_with('/');
                for t in target.split('/').filter(|t| !t.is_empty() && *t != ".") {
                    if t == ".." {
                        if level == 0 {
                            leaves = true;
                            break;
                        }
                        level -= 1;
                    } else {
                        level += 1;
                    }
                }
                return leaves.then(|| {
                    format!(
                        "`{prefix}` (in a granted directory) is a symlink to `{target}`, which leads out of that grant: \
                         the host never follows a symlink out of a grant (anything with write access there could have \
                         made it); read the target's real path through a grant covering it"
                    )
                });
            }
            if stat.type_ != fs::DescriptorType::Directory {
                return None;
            }
        }
        None
    }
}

impl preopens::Host for GuardedFs<'_> {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<fs::Descriptor>, String)>> {
        let dirs = preopens::Host::get_directories(&mut self.fs)?;
        for (fd, guest) in &dirs {
            self.descriptors.insert(fd.rep(), Arc::from(guest.as_str()));
        }
        Ok(dirs)
    }
}

impl fs::Host for GuardedFs<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<fs::ErrorCode> {
        fs::Host::convert_error_code(&mut self.fs, err)
    }
    fn filesystem_error_code(
        &mut self,
        err: Resource<streams::Error>,
    ) -> wasmtime::Result<Option<fs::ErrorCode>> {
        fs::Host::filesystem_error_code(&mut self.fs, err)
    }
}

impl fs::HostDescriptor for GuardedFs<'_> {
    fn open_at(
        &mut self,
        fd: Resource<fs::Descriptor>,
        path_flags: fs::PathFlags,
        path: String,
        oflags: fs::OpenFlags,
        flags: fs::DescriptorFlags,
    ) -> FsResult<Resource<fs::Descriptor>> {
        // A missing file (to be created) or any error is left to the open itself.
        let probe = Resource::<fs::Descriptor>::new_borrow(fd.rep());
        if let Ok(stat) = fs::HostDescriptor::stat_at(&mut self.fs, probe, path_flags, path.clone())
            && !openable(stat.type_)
        {
            tracing::info!(path = %path, kind = ?stat.type_, "plugin open refused: not a regular file or directory");
            return Err(FsError::from(ErrorCode::NotPermitted));
        }
        let parent = fd.rep();
        self.touch(parent);
        let dir = Resource::<fs::Descriptor>::new_borrow(parent);
        let opened =
            fs::HostDescriptor::open_at(&mut self.fs, fd, path_flags, path.clone(), oflags, flags);
        if let Ok(child) = &opened
            && let Some(grant) = self.descriptors.get(&parent).cloned()
        {
            self.descriptors.insert(child.rep(), grant);
        }
        if let Err(e) = &opened
            && matches!(
                e.downcast_ref(),
                Some(ErrorCode::NotPermitted | ErrorCode::Access)
            )
            && let Some(why) = self.symlink_out_of_grant(dir, &path)
        {
            crate::sandbox::record_denial(self.denied, "filesystem", why);
        }
        opened
    }

    fn advise(
        &mut self,
        fd: Resource<fs::Descriptor>,
        offset: fs::Filesize,
        len: fs::Filesize,
        advice: fs::Advice,
    ) -> FsResult<()> {
        fs::HostDescriptor::advise(&mut self.fs, fd, offset, len, advice)
    }
    fn sync_data(&mut self, fd: Resource<fs::Descriptor>) -> FsResult<()> {
        fs::HostDescriptor::sync_data(&mut self.fs, fd)
    }
    fn get_flags(&mut self, fd: Resource<fs::Descriptor>) -> FsResult<fs::DescriptorFlags> {
        fs::HostDescriptor::get_flags(&mut self.fs, fd)
    }
    fn get_type(&mut self, fd: Resource<fs::Descriptor>) -> FsResult<fs::DescriptorType> {
        fs::HostDescriptor::get_type(&mut self.fs, fd)
    }
    fn set_size(&mut self, fd: Resource<fs::Descriptor>, size: fs::Filesize) -> FsResult<()> {
        fs::HostDescriptor::set_size(&mut self.fs, fd, size)
    }
    fn set_times(
        &mut self,
        fd: Resource<fs::Descriptor>,
        atim: fs::NewTimestamp,
        mtim: fs::NewTimestamp,
    ) -> FsResult<()> {
        fs::HostDescriptor::set_times(&mut self.fs, fd, atim, mtim)
    }
    fn read(
        &mut self,
        fd: Resource<fs::Descriptor>,
        len: fs::Filesize,
        offset: fs::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        fs::HostDescriptor::read(&mut self.fs, fd, len, offset)
    }
    fn write(
        &mut self,
        fd: Resource<fs::Descriptor>,
        buf: Vec<u8>,
        offset: fs::Filesize,
    ) -> FsResult<fs::Filesize> {
        fs::HostDescriptor::write(&mut self.fs, fd, buf, offset)
    }
    fn read_directory(
        &mut self,
        fd: Resource<fs::Descriptor>,
    ) -> FsResult<Resource<fs::DirectoryEntryStream>> {
        self.touch(fd.rep());
        fs::HostDescriptor::read_directory(&mut self.fs, fd)
    }
    fn sync(&mut self, fd: Resource<fs::Descriptor>) -> FsResult<()> {
        fs::HostDescriptor::sync(&mut self.fs, fd)
    }
    fn create_directory_at(&mut self, fd: Resource<fs::Descriptor>, path: String) -> FsResult<()> {
        self.touch(fd.rep());
        fs::HostDescriptor::create_directory_at(&mut self.fs, fd, path)
    }
    fn stat(&mut self, fd: Resource<fs::Descriptor>) -> FsResult<fs::DescriptorStat> {
        fs::HostDescriptor::stat(&mut self.fs, fd)
    }
    fn stat_at(
        &mut self,
        fd: Resource<fs::Descriptor>,
        path_flags: fs::PathFlags,
        path: String,
    ) -> FsResult<fs::DescriptorStat> {
        self.touch(fd.rep());
        fs::HostDescriptor::stat_at(&mut self.fs, fd, path_flags, path)
    }
    fn set_times_at(
        &mut self,
        fd: Resource<fs::Descriptor>,
        path_flags: fs::PathFlags,
        path: String,
        atim: fs::NewTimestamp,
        mtim: fs::NewTimestamp,
    ) -> FsResult<()> {
        self.touch(fd.rep());
        fs::HostDescriptor::set_times_at(&mut self.fs, fd, path_flags, path, atim, mtim)
    }
    fn link_at(
        &mut self,
        fd: Resource<fs::Descriptor>,
        old_path_flags: fs::PathFlags,
        old_path: String,
        new_descriptor: Resource<fs::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.touch(fd.rep());
        self.touch(new_descriptor.rep());
        fs::HostDescriptor::link_at(
            &mut self.fs,
            fd,
            old_path_flags,
            old_path,
            new_descriptor,
            new_path,
        )
    }
    fn drop(&mut self, fd: Resource<fs::Descriptor>) -> wasmtime::Result<()> {
        self.descriptors.remove(&fd.rep());
        fs::HostDescriptor::drop(&mut self.fs, fd)
    }
    fn readlink_at(&mut self, fd: Resource<fs::Descriptor>, path: String) -> FsResult<String> {
        self.touch(fd.rep());
        fs::HostDescriptor::readlink_at(&mut self.fs, fd, path)
    }
    fn remove_directory_at(&mut self, fd: Resource<fs::Descriptor>, path: String) -> FsResult<()> {
        self.touch(fd.rep());
        fs::HostDescriptor::remove_directory_at(&mut self.fs, fd, path)
    }
    fn rename_at(
        &mut self,
        fd: Resource<fs::Descriptor>,
        old_path: String,
        new_fd: Resource<fs::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.touch(fd.rep());
        self.touch(new_fd.rep());
        fs::HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path)
    }
    fn symlink_at(
        &mut self,
        fd: Resource<fs::Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        self.touch(fd.rep());
        fs::HostDescriptor::symlink_at(&mut self.fs, fd, src_path, dest_path)
    }
    fn unlink_file_at(&mut self, fd: Resource<fs::Descriptor>, path: String) -> FsResult<()> {
        self.touch(fd.rep());
        fs::HostDescriptor::unlink_file_at(&mut self.fs, fd, path)
    }
    fn read_via_stream(
        &mut self,
        fd: Resource<fs::Descriptor>,
        offset: fs::Filesize,
    ) -> FsResult<Resource<streams::InputStream>> {
        fs::HostDescriptor::read_via_stream(&mut self.fs, fd, offset)
    }
    fn write_via_stream(
        &mut self,
        fd: Resource<fs::Descriptor>,
        offset: fs::Filesize,
    ) -> FsResult<Resource<streams::OutputStream>> {
        fs::HostDescriptor::write_via_stream(&mut self.fs, fd, offset)
    }
    fn append_via_stream(
        &mut self,
        fd: Resource<fs::Descriptor>,
    ) -> FsResult<Resource<streams::OutputStream>> {
        fs::HostDescriptor::append_via_stream(&mut self.fs, fd)
    }
    fn is_same_object(
        &mut self,
        a: Resource<fs::Descriptor>,
        b: Resource<fs::Descriptor>,
    ) -> wasmtime::Result<bool> {
        fs::HostDescriptor::is_same_object(&mut self.fs, a, b)
    }
    fn metadata_hash(&mut self, fd: Resource<fs::Descriptor>) -> FsResult<fs::MetadataHashValue> {
        fs::HostDescriptor::metadata_hash(&mut self.fs, fd)
    }
    fn metadata_hash_at(
        &mut self,
        fd: Resource<fs::Descriptor>,
        path_flags: fs::PathFlags,
        path: String,
    ) -> FsResult<fs::MetadataHashValue> {
        self.touch(fd.rep());
        fs::HostDescriptor::metadata_hash_at(&mut self.fs, fd, path_flags, path)
    }
}

impl fs::HostDirectoryEntryStream for GuardedFs<'_> {
    fn read_directory_entry(
        &mut self,
        stream: Resource<fs::DirectoryEntryStream>,
    ) -> FsResult<Option<fs::DirectoryEntry>> {
        fs::HostDirectoryEntryStream::read_directory_entry(&mut self.fs, stream)
    }
    fn drop(&mut self, stream: Resource<fs::DirectoryEntryStream>) -> wasmtime::Result<()> {
        fs::HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}
