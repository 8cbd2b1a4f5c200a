// bench/nat-profile.ts, its pure half: a program's run counters are read
// from the kernel's fdinfo of tc programs only.
import t from 'tap';
import { parseProgFdinfo } from '../../bench/nat-profile';

const PROG_FDINFO = `pos:\t0
flags:\t02000002
mnt_id:\t15
ino:\t2073
prog_type:\t3
prog_jited:\t1
prog_tag:\t6b0e4c0a1f4e8a7d
memlock:\t8192
prog_id:\t981
run_time_ns:\t123456789
run_cnt:\t400000
recursion_misses:\t0
verified_insns:\t1722
`;

t.test('a tc program\'s id, runs and run time from its fdinfo', async (t) => {
  t.same(parseProgFdinfo(PROG_FDINFO), { id: 981, runCnt: 400_000, runTimeNs: 123_456_789 });
});

t.test('anything else is not a program of ours', async (t) => {
  t.equal(parseProgFdinfo(PROG_FDINFO.replace('prog_type:\t3', 'prog_type:\t6')), undefined, 'an XDP program');
  t.equal(parseProgFdinfo('pos:\t0\nflags:\t02\nmap_type:\t9\n'), undefined, 'a map');
});
