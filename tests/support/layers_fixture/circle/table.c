/* "Pure" data that reports by calling upward: the circle. */
int notify_changed(int);
static int helper(int x) { return x * 2; }
int table_put(int x)
{
    /* loop_wake(x) in a comment is no call */
    const char *s = "notify_changed(x) in a string is no call";
    (void)s;
    return notify_changed(helper(x));
}
