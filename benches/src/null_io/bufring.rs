//! A provided-buffer ring (`IORING_REGISTER_PBUF_RING`, kernel 5.19+): the kernel picks a
//! buffer for each multishot recv completion, so no connection holds a buffer while it waits,
//! and a recv armed once serves every later arrival. The ring of buffer descriptors is shared
//! memory the kernel reads; we hand a buffer back by writing its descriptor at the tail and
//! publishing the tail, once a turn for all the buffers the turn consumed.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;
use io_uring::IoUring;

/// The buffer group the multishot recvs name.
pub const GROUP: u16 = 0;

pub struct BufRing {
    /// The descriptors: page-aligned, `entries` of them, shared with the kernel.
    ring: *mut BufRingEntry,
    layout: Layout,
    /// The buffers themselves, `entries` × `size` bytes.
    data: Vec<u8>,
    entries: u16,
    size: usize,
    /// Our tail, published to the kernel by [`BufRing::publish`].
    tail: u16,
}

impl BufRing {
    /// Registers `entries` (a power of two) buffers of `size` bytes with `ring`, all of them
    /// given to the kernel.
    pub fn register(ring: &IoUring, entries: u16, size: usize) -> io::Result<BufRing> {
        assert!(entries.is_power_of_two());
        let bytes = usize::from(entries) * std::mem::size_of::<BufRingEntry>();
        let layout = Layout::from_size_align(bytes, 4096).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size (entries > 0) and a valid alignment.
        let mem = unsafe { alloc_zeroed(layout) }.cast::<BufRingEntry>();
        if mem.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        let mut me = BufRing {
            ring: mem,
            layout,
            data: vec![0; usize::from(entries) * size],
            entries,
            size,
            tail: 0,
        };
        for bid in 0..entries {
            me.give_back(bid);
        }
        me.publish();
        // SAFETY: the descriptors live until `Drop`, which unregisters them first; the
        // buffers they point at live as long (`data` is never resized).
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(mem as u64, entries, GROUP, 0)?
        };
        Ok(me)
    }

    /// The bytes the kernel wrote into buffer `bid`.
    pub fn get(&self, bid: u16, len: usize) -> &[u8] {
        let at = usize::from(bid) * self.size;
        &self.data[at..at + len.min(self.size)]
    }

    /// Writes buffer `bid`'s descriptor at our tail; the kernel sees it at [`BufRing::publish`].
    pub fn give_back(&mut self, bid: u16) {
        let slot = usize::from(self.tail & (self.entries - 1));
        let addr = self.data.as_ptr() as u64 + (usize::from(bid) * self.size) as u64;
        // SAFETY: `slot` < entries, inside the allocation; the kernel reads only the slots
        // between its head and the published tail, and this one is past the published tail.
        let e = unsafe { &mut *self.ring.add(slot) };
        e.set_addr(addr);
        e.set_len(self.size as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Publishes the tail: every buffer given back so far may be used by the kernel.
    pub fn publish(&self) {
        // SAFETY: the tail field is the reserved word of the first descriptor, inside the
        // allocation and suitably aligned for a u16; the kernel reads it with acquire
        // semantics, so the descriptors written before are visible to it.
        unsafe {
            let tail = BufRingEntry::tail(self.ring).cast_mut().cast::<AtomicU16>();
            (*tail).store(self.tail, Ordering::Release);
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `register` with this layout; the ring that used it is gone or
        // has unregistered it (the loop drops the ring before this, see `uring::Loop`).
        unsafe { dealloc(self.ring.cast(), self.layout) };
    }
}
