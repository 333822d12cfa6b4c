/* cove-guest: PID 1 inside a sandbox (placeholder until guest/ lands). */
int main(void)
{
        return 1;
}
