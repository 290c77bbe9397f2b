/*
 * models.c: the model that answered each attempt of a run.  A caller names it
 * in meta ({"model": "..."}; the clients put an attempt's model on its every
 * call).  The first call of an attempt that names one records it
 * (run_models); when a later attempt's model is not the one the run's
 * latest earlier attempt recorded, that is audited once (model_changed) and
 * a divergence pause of the attempt says so (decide.c): the only thing that
 * tells a run broke because the model shifted under it.
 *
 * That the attempt's model is recorded is an epoch counter (counters.c, of
 * no tool: a tool's name is never empty), so the attempt's later calls ask
 * nothing more: a session lease keeps it in memory, a token lease in its
 * counters' table; either rolls back with the call that recorded it.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "policy.h"

static const char MODEL_NOTED[] = "\0model";

/* meta.model when it is a string, else NULL. */
static char *
meta_model(Jsonb *meta)
{
	JsonbValue *value;

	if (meta == NULL || !JB_ROOT_IS_OBJECT(meta))
		return NULL;
	value = getKeyJsonValueFromContainer(&meta->root, "model", 5, NULL);
	if (value == NULL || value->type != jbvString || value->val.string.len == 0)
		return NULL;
	return pnstrdup(value->val.string.val, value->val.string.len);
}

/* The call's meta may name its attempt's model: recorded once per attempt. */
void
dl_note_attempt_model(const CallLease *lease, Jsonb *meta)
{
	char	   *model = meta_model(meta);
	char	   *earlier;
	EpochCounter noted;
	DetailBuilder detail;

	if (model == NULL)
		return;
	dl_epoch_counter(lease, "", MODEL_NOTED, sizeof(MODEL_NOTED) - 1, &noted);
	if (noted.count > 0)
		return;
	dl_epoch_count(lease, &noted, 1);
	if (dl_read_attempt_model(lease->run, lease->epoch, NULL) != NULL)
		return;
	earlier = lease->epoch > 1 ? dl_read_earlier_model(lease->run, lease->epoch) : NULL;
	if (earlier != NULL && strcmp(earlier, model) == 0)
		earlier = NULL;
	dl_write_attempt_model(lease->run, lease->epoch, model, earlier);
	if (earlier == NULL)
		return;
	dl_detail_init(&detail);
	dl_detail_text(&detail, "from", earlier);
	dl_detail_text(&detail, "to", model);
	dl_write_audit(lease->run, NULL, AUDIT_MODEL_CHANGED, dl_detail_finish(&detail),
				   lease->epoch, 0);
}
