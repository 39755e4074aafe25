/* A libiscsi client that sends whatever CDBs it is given: the second, independent client
 * of the LUN-masking walk (testkit's walk.rs). Logs in with libiscsi as INITIATOR to
 * TARGET at PORTAL, then for each line on standard input
 *     LUN DIR LEN CDB-HEX DATA-HEX      (DIR: n none, r read LEN bytes, w write DATA-HEX;
 *                                        DATA-HEX is "-" unless DIR is w)
 * sends the CDB to LUN and prints one line
 *     STATUS KEY ASC ASCQ DATA-HEX      (DATA-HEX "-" when no data came back)
 * or "ERROR message" when libiscsi could not carry the command. Built by the test with
 * the system's cc against Debian's libiscsi-dev.
 *     libiscsi_cdb INITIATOR PORTAL TARGET LOGIN-LUN */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
