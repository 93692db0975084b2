//! Slot arithmetic of a Redis Cluster, computed independently of the client library under
//! test: the CRC16 of key slots and the `CLUSTER SLOTS` map.

use redis::Value;

/// CRC16/XMODEM (polynomial 0x1021, initial 0), the checksum of Redis Cluster key slots.
pub(super) fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The `(first slot, last slot, master index)` ranges of a `CLUSTER SLOTS` reply, sorted;
/// a master's index is its port's position in `ports`.
pub(super) fn parse_slot_map(
    reply: &Value,
    ports: &[u16],
) -> Result<Vec<(u16, u16, usize)>, String> {
    let bad = || format!("unexpected CLUSTER SLOTS reply {reply:?}");
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let mut map = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad());
        };
        let [Value::Int(start), Value::Int(end), Value::Array(master), ..] = parts.as_slice()
        else {
            return Err(bad());
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return Err(bad());
        };
        let index = ports
            .iter()
            .position(|p| i64::from(*p) == *port)
            .ok_or_else(|| format!("CLUSTER SLOTS names an unknown port {port}"))?;
        let (start, end) = (
            u16::try_from(*start).map_err(|_| bad())?,
            u16::try_from(*end).map_err(|_| bad())?,
        );
        map.push((start, end, index));
    }
    map.sort_unstable();
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RedisCluster;

    #[test]
    fn slots_are_computed_as_the_cluster_does() {
        // The check value of CRC16/XMODEM, and slots `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(RedisCluster::slot_of("foo"), 12182);
        assert_eq!(
            RedisCluster::slot_of("{user1000}.following"),
            RedisCluster::slot_of("user1000")
        );
        assert_eq!(
            RedisCluster::slot_of("{}x"),
            crc16(b"{}x") % crate::CLUSTER_SLOTS
        );
    }
}
