static int helper(int x) { return x * 2; }
struct row { int a, b; };
static const struct row rows[] = {{1, 2}, {3, 4}};
int table_put(int x) { return helper(x) + rows[0].a; }
