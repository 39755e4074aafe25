/* A libiscsi client that sends whatever CDBs it is given: the second, independent client
 * of the LUN-masking walk (testkit's walk.rs). Logs in with libiscsi as INITIATOR to
 * TARGET at PORTAL, then for each line on standard input
 *     LUN DIR LEN CDB-HEX DATA-HEX      (DIR: n none, r read LEN bytes, w write DATA-HEX;
 *                                        DATA-HEX is "-" unless DIR is w)
 * sends the CDB to LUN and prints one line
 *     STATUS KEY ASC ASCQ DATA-HEX      (DATA-HEX "-" when no data came back)
 * or "ERROR message" when libiscsi could not carry the command. Two more requests:
 *     stream LUN SLOTS BLOCKS SUBMIT-MS GRACE-MS
 * keeps one WRITE(16) of BLOCKS 512-byte blocks in flight per slot (slot i at LBA
 * i * BLOCKS), each write's every 8 bytes its sequence number (1, 2, ...), and writes a
 * slot again as soon as its last write answered GOOD; prints "streaming" once the first
 * write answered GOOD; stops writing after SUBMIT-MS or at the first answer that is not
 * GOOD, then waits up to GRACE-MS for the writes still out, and prints
 *     stream GOOD CONFLICT CHECK OTHER UNANSWERED SENSES
 * (SENSES: KEY/ASC/ASCQ of each CHECK CONDITION in hex, comma-separated, or "-"); a write
 * the target aborted without an answer (PREEMPT AND ABORT, TAS 0) stays UNANSWERED.
 *     seqs LUN SLOTS BLOCKS
 * reads the slots back and prints "seqs" and, per slot, the sequence number its first
 * block holds, or "torn" when the slot's blocks do not all hold the same one.
 * Built by the test with the system's cc against Debian's libiscsi-dev.
 *     libiscsi_cdb INITIATOR PORTAL TARGET LOGIN-LUN */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

static int unhex(const char *s, unsigned char *out, size_t max)
{
	size_t n = strlen(s);
	if (strcmp(s, "-") == 0)
		return 0;
	if (n % 2 || n / 2 > max)
		return -1;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned int b;
		if (sscanf(s + 2 * i, "%2x", &b) != 1)
			return -1;
		out[i] = (unsigned char)b;
	}
	return (int)(n / 2);
}

static long long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

struct stream;

struct slot {
	struct stream *s;
	int index;
	unsigned char *buf;
};

struct stream {
	struct iscsi_context *iscsi;
	int lun, blocks, outstanding, stop, announced;
	uint64_t seq;
	long good, conflict, check, other;
	char senses[4096];
	long long deadline, stopped_at;
};

static void stop_stream(struct stream *s)
{
	if (!s->stop) {
		s->stop = 1;
		s->stopped_at = now_ms();
	}
}

static void write_done(struct iscsi_context *iscsi, int status, void *command_data, void *private);

static int submit(struct slot *sl)
{
	struct stream *s = sl->s;
	uint32_t len = (uint32_t)s->blocks * 512;
	uint64_t seq = ++s->seq;
	for (uint32_t i = 0; i + 8 <= len; i += 8)
		memcpy(sl->buf + i, &seq, 8);
	struct scsi_task *t = iscsi_write16_task(s->iscsi, s->lun, (uint64_t)sl->index * s->blocks,
						 sl->buf, len, 512, 0, 0, 0, 0, 0, write_done, sl);
	if (!t)
		return -1;
	s->outstanding++;
	return 0;
}

static void write_done(struct iscsi_context *iscsi, int status, void *command_data, void *private)
{
	(void)iscsi;
	struct slot *sl = private;
	struct stream *s = sl->s;
	struct scsi_task *task = command_data;
	s->outstanding--;
	if (status == SCSI_STATUS_GOOD) {
		s->good++;
	} else if (status == SCSI_STATUS_RESERVATION_CONFLICT) {
		s->conflict++;
		stop_stream(s);
	} else if (status == SCSI_STATUS_CHECK_CONDITION && task) {
		s->check++;
		size_t n = strlen(s->senses);
		if (n + 16 < sizeof s->senses)
			snprintf(s->senses + n, sizeof s->senses - n, "%s%02x/%02x/%02x", n ? "," : "",
				 task->sense.key, (task->sense.ascq >> 8) & 0xff, task->sense.ascq & 0xff);
		stop_stream(s);
	} else {
		s->other++;
		stop_stream(s);
	}
	if (task)
		scsi_free_scsi_task(task);
	if (status == SCSI_STATUS_GOOD && !s->announced) {
		s->announced = 1;
		printf("streaming\n");
		fflush(stdout);
	}
	if (!s->stop && now_ms() >= s->deadline)
		stop_stream(s);
	if (!s->stop && submit(sl) != 0)
		stop_stream(s);
}

static void run_stream(struct iscsi_context *iscsi, int lun, int slots, int blocks, int submit_ms,
		       int grace_ms)
{
	struct stream s = { .iscsi = iscsi, .lun = lun, .blocks = blocks };
	s.deadline = now_ms() + submit_ms;
	/* Slots whose write is never answered keep their buffer: not freed. */
	struct slot *sl = calloc((size_t)slots, sizeof *sl);
	for (int i = 0; i < slots; i++) {
		sl[i] = (struct slot){ .s = &s, .index = i, .buf = malloc((size_t)blocks * 512) };
		if (submit(&sl[i]) != 0) {
			stop_stream(&s);
			break;
		}
	}
	for (;;) {
		if (!s.stop && now_ms() >= s.deadline)
			stop_stream(&s);
		if (s.stop && (s.outstanding == 0 || now_ms() >= s.stopped_at + grace_ms))
			break;
		struct pollfd pfd = { .fd = iscsi_get_fd(iscsi), .events = iscsi_which_events(iscsi) };
		if (poll(&pfd, 1, 20) < 0)
			break;
		if (iscsi_service(iscsi, pfd.revents) < 0) {
			s.other += s.outstanding;
			s.outstanding = 0;
			break;
		}
	}
	if (!s.announced)
		printf("streaming\n");
	printf("stream %ld %ld %ld %ld %d %s\n", s.good, s.conflict, s.check, s.other, s.outstanding,
	       s.senses[0] ? s.senses : "-");
	fflush(stdout);
}

static void read_seqs(struct iscsi_context *iscsi, int lun, int slots, int blocks)
{
	printf("seqs");
	for (int i = 0; i < slots; i++) {
		uint32_t len = (uint32_t)blocks * 512;
		struct scsi_task *t = iscsi_read16_sync(iscsi, lun, (uint64_t)i * blocks, len, 512, 0,
							0, 0, 0, 0);
		if (!t || t->status != SCSI_STATUS_GOOD || t->datain.size < (int)len) {
			printf(" error");
		} else {
			uint64_t first;
			memcpy(&first, t->datain.data, 8);
			int same = 1;
			for (uint32_t j = 8; j + 8 <= len && same; j += 8)
				same = memcmp(t->datain.data + j, &first, 8) == 0;
			if (same)
				printf(" %llu", (unsigned long long)first);
			else
				printf(" torn");
		}
		if (t)
			scsi_free_scsi_task(t);
	}
	printf("\n");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s INITIATOR PORTAL TARGET LOGIN-LUN\n", argv[0]);
		return 2;
	}
	struct iscsi_context *iscsi = iscsi_create_context(argv[1]);
	if (!iscsi) {
		fprintf(stderr, "no iSCSI context\n");
		return 1;
	}
	iscsi_set_targetname(iscsi, argv[3]);
	/* A fixed ISID when asked (libiscsi picks a random one): the same initiator port
	 * after logging in again, as reservations kept across a restart need. */
	const char *isid = getenv("LIBISCSI_CDB_ISID");
	if (isid)
		iscsi_set_isid_random(iscsi, (uint32_t)strtoul(isid, NULL, 16), 0);
	iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
	if (iscsi_full_connect_sync(iscsi, argv[2], atoi(argv[4])) != 0) {
		fprintf(stderr, "login failed: %s\n", iscsi_get_error(iscsi));
		return 1;
	}
	printf("ready\n");
	fflush(stdout);

	static char line[1 << 20];
	static unsigned char cdb[64], data[1 << 18];
	while (fgets(line, sizeof line, stdin)) {
		char dir[4], cdb_hex[256], data_hex[1 << 19];
		int lun, len;
		int slots, blocks, submit_ms, grace_ms;
		if (sscanf(line, "stream %d %d %d %d %d", &lun, &slots, &blocks, &submit_ms, &grace_ms) == 5) {
			if (slots < 1 || blocks < 1 || blocks > 16384) {
				printf("ERROR bad stream\n");
				fflush(stdout);
				continue;
			}
			run_stream(iscsi, lun, slots, blocks, submit_ms, grace_ms);
			continue;
		}
		if (sscanf(line, "seqs %d %d %d", &lun, &slots, &blocks) == 3) {
			read_seqs(iscsi, lun, slots, blocks);
			continue;
		}
		if (sscanf(line, "%d %3s %d %255s %524287s", &lun, dir, &len, cdb_hex, data_hex) != 5) {
			printf("ERROR malformed request\n");
			fflush(stdout);
			continue;
		}
		int cdb_len = unhex(cdb_hex, cdb, sizeof cdb);
		int data_len = unhex(data_hex, data, sizeof data);
		if (cdb_len <= 0 || data_len < 0) {
			printf("ERROR malformed hex\n");
			fflush(stdout);
			continue;
		}
		int xfer = dir[0] == 'r' ? SCSI_XFER_READ : dir[0] == 'w' ? SCSI_XFER_WRITE : SCSI_XFER_NONE;
		int expected = dir[0] == 'w' ? data_len : dir[0] == 'r' ? len : 0;
		struct scsi_task *task = scsi_create_task(cdb_len, cdb, xfer, expected);
		struct iscsi_data out = { .size = (size_t)data_len, .data = data };
		if (!task) {
			printf("ERROR no task\n");
			fflush(stdout);
			continue;
		}
		if (!iscsi_scsi_command_sync(iscsi, lun, task, dir[0] == 'w' ? &out : NULL)) {
			printf("ERROR %s\n", iscsi_get_error(iscsi));
			fflush(stdout);
			scsi_free_scsi_task(task);
			continue;
		}
		printf("%d %d %d %d ", task->status, task->sense.key, (task->sense.ascq >> 8) & 0xff,
		       task->sense.ascq & 0xff);
		if (task->datain.size <= 0)
			printf("-");
		for (int i = 0; i < task->datain.size; i++)
			printf("%02x", task->datain.data[i]);
		printf("\n");
		fflush(stdout);
		scsi_free_scsi_task(task);
	}
	iscsi_logout_sync(iscsi);
	iscsi_destroy_context(iscsi);
	return 0;
}
