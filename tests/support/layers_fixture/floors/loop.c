/* The same three files with the report returned instead of called up. */
int table_put(int);
int notify_changed(int);
struct hook { int (*fn)(int); };
static struct hook h = {0};
int loop_run(int x)
{
    int changed = table_put(x);
    return changed ? notify_changed(x) : h.fn ? h.fn(x) : 0;
}
