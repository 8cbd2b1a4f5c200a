// Unit tests of VRID assignment: 255 VIPs per advert (RFC 5798 §5.2.5), pinned
// VRIDs kept and skipped by the spill, Share IP services ride their primary.
import t from 'tap';
import { assignVrids, type VridCandidate } from '../../agent/failover/assign';

const svc = (n: number, over: Partial<VridCandidate> = {}): VridCandidate => ({ key: `default/s${n}`, ...over });
const many = (count: number, from = 0): VridCandidate[] => Array.from({ length: count }, (_, i) => svc(from + i));

t.test('everything on the base VRID while it has room', async (t) => {
  const a = assignVrids(many(255), 51);
  t.equal(new Set(a.vrids.values()).size, 1);
  t.equal(a.vrids.get('default/s0'), 51);
  t.same([...a.load], [[51, 255]]);
  t.same(a.overflow, []);
});

t.test('the 256th VIP spills to the next VRID; config order decides who spills', async (t) => {
  const a = assignVrids(many(600), 51);
  t.equal(a.vrids.get('default/s254'), 51);
  t.equal(a.vrids.get('default/s255'), 52);
  t.equal(a.vrids.get('default/s599'), 53);
  t.same([...a.load], [[51, 255], [52, 255], [53, 90]]);
  const more = assignVrids(many(601), 51);
  const moved = [...a.vrids].filter(([k, v]) => more.vrids.get(k) !== v);
  t.same(moved, [], 'adding a service at the end moves no existing one');
});

t.test('pinned VRIDs are kept and the spill skips them', async (t) => {
  const services = [...many(255), svc(1000, { vrid: 52 }), svc(1001)];
  const a = assignVrids(services, 51);
  t.equal(a.vrids.get('default/s1000'), 52, 'pinned');
  t.equal(a.vrids.get('default/s1001'), 53, 'spill skips the pinned 52');
  t.same(a.overflow, []);
});

t.test('pinning the base VRID is the same as not pinning', async (t) => {
  const a = assignVrids([svc(0, { vrid: 51 }), svc(1)], 51);
  t.same([...a.vrids.values()], [51, 51]);
});

t.test('a Share IP service rides its primary and is not counted twice', async (t) => {
  const services = [svc(0, { vrid: 60 }), { key: 'default/b', primaryService: 'default/s0', vrid: 70 }, svc(1)];
  const a = assignVrids(services, 51);
  t.equal(a.vrids.get('default/b'), 60, "the primary's VRID wins over its own");
  t.same([...a.load].sort(), [[51, 1], [60, 1]]);
  const orphan = assignVrids([{ key: 'default/x', primaryService: 'default/missing' }], 51);
  t.equal(orphan.vrids.get('default/x'), 51, 'an unknown primary: placed as a primary itself');
});

t.test('wraps past 255, and overflows when all VRIDs are full', async (t) => {
  const a = assignVrids(many(300), 255);
  t.equal(a.vrids.get('default/s255'), 1, 'after 255 comes 1');
  const full = assignVrids(many(255 * 255 + 2), 1);
  t.same(full.overflow, [`default/s${255 * 255}`, `default/s${255 * 255 + 1}`]);
  const pinnedFull = assignVrids(Array.from({ length: 256 }, (_, i) => svc(i, { vrid: 9 })), 1);
  t.same(pinnedFull.overflow, ['default/s255'], 'a pinned VRID does not spill: reported instead');
});

t.test('a smaller limit (tests, or a LAN that drops big frames)', async (t) => {
  const a = assignVrids(many(5), 10, 2);
  t.same([...a.vrids.values()], [10, 10, 11, 11, 12]);
});
