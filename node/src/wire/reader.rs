//! Reading a message's bytes: every read checks the length first and returns a [`WireError`].

use super::*;

pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(WireError::Truncated { needed: self.at.saturating_add(n), have: self.bytes.len() })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(super) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    pub(super) fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(super) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Gives back the unread tail of what [`Reader::rest`] took (a part read by its own codec).
    pub(super) fn put_back(&mut self, rest: &'a [u8]) {
        self.at = self.bytes.len() - rest.len();
    }

    pub(super) fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    pub(super) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(super) fn f32(&mut self) -> Result<f32, WireError> {
        Ok(f32::from_le_bytes(self.array()?))
    }

    pub(super) fn rest(&mut self) -> &'a [u8] {
        let out = &self.bytes[self.at..];
        self.at = self.bytes.len();
        out
    }

    pub(super) fn blob(&mut self) -> Result<Vec<u8>, WireError> {
        let len = self.u32()? as usize;
        if len > MAX_MESSAGE_BYTES {
            return Err(WireError::Invalid(format!("declared length {len} is over the limit")));
        }
        Ok(self.take(len)?.to_vec())
    }

    pub(super) fn text(&mut self) -> Result<String, WireError> {
        let len = self.u16()? as usize;
        if len > MAX_INFO_TEXT {
            return Err(WireError::Invalid(format!("a text of {len} bytes")));
        }
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| WireError::Invalid("text is not UTF-8".into()))
    }

    pub(super) fn finish(&self) -> Result<(), WireError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}
