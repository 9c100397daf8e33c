using System;
using System.Collections.Generic;
using System.Data.Common;
using System.Globalization;
using System.IO;
using System.Threading.Tasks;
using Microsoft.Data.Sqlite;
using Microsoft.Extensions.Logging;
using Npgsql;

namespace Storefront.Data
{
    public sealed class Product
    {
        public long Id { get; set; }
        public string Name { get; set; }
        public string Category { get; set; }
        public long PriceCents { get; set; }
    }

    /// <summary>The service's database: PostgreSQL through Npgsql when given a connection string,
    /// else a SQLite file (Microsoft.Data.Sqlite, WAL). One ADO.NET path for both; the SQL is the
    /// dialect they share (named @parameters, ON CONFLICT, RETURNING).</summary>
    public sealed class Store : IDisposable
    {
        readonly NpgsqlDataSource postgres;
        readonly string sqliteConnectionString;
        readonly string sqlitePath;

        public string Kind => postgres != null ? "postgresql" : "sqlite";
        public string ServerVersion { get; private set; }
        /// <summary>Where the data is: the SQLite file, or the PostgreSQL host and database.</summary>
        public string Location { get; }
        /// <summary>This process's rows of `orders` carry it (several instances may share a database).</summary>
        public string Instance { get; }

        Store(NpgsqlDataSource postgres, string sqlitePath, string instance)
        {
            this.postgres = postgres;
            this.sqlitePath = sqlitePath;
            Instance = instance;
            if (postgres != null)
            {
                var csb = new NpgsqlConnectionStringBuilder(postgres.ConnectionString);
                Location = csb.Host + "/" + csb.Database;
            }
            else
            {
                sqliteConnectionString = new SqliteConnectionStringBuilder
                {
                    DataSource = sqlitePath,
                    Pooling = true,
                    DefaultTimeout = 30, // also how long a writer waits for the database lock
                }.ToString();
                Location = sqlitePath;
            }
        }

        /// <summary>$TMPDIR/storefront-PID.db: the SQLite file when none is named.</summary>
        public static string DefaultSqlitePath(int pid)
        {
            return Path.Combine(Path.GetTempPath(), "storefront-" + pid.ToString(CultureInfo.InvariantCulture) + ".db");
        }

        /// <summary>Removes the default SQLite files of instances no longer running (a killed process
        /// cannot remove its own).</summary>
        public static void RemoveDeadInstancesFiles()
        {
            foreach (string file in Directory.EnumerateFiles(Path.GetTempPath(), "storefront-*.db*"))
            {
                string name = Path.GetFileName(file);
                int dot = name.IndexOf('.');
                if (!int.TryParse(name.AsSpan("storefront-".Length, dot - "storefront-".Length), NumberStyles.None, CultureInfo.InvariantCulture, out int pid))
                    continue;
                if (!Directory.Exists("/proc/" + pid.ToString(CultureInfo.InvariantCulture)))
                    File.Delete(file);
            }
        }

        public static Store Open(string postgresConnectionString, string sqlitePath, ILoggerFactory loggers, string instance)
        {
            if (postgresConnectionString != null)
            {
                var builder = new NpgsqlDataSourceBuilder(postgresConnectionString);
                builder.UseLoggerFactory(loggers);
                return new Store(builder.Build(), null, instance);
            }
            foreach (string suffix in new[] { "", "-wal", "-shm" }) File.Delete(sqlitePath + suffix);
            return new Store(null, sqlitePath, instance);
        }

        public async Task<DbConnection> OpenConnection()
        {
            Counts.Add(ref Counts.DbQueries);
            if (postgres != null) return await postgres.OpenConnectionAsync();
            var c = new SqliteConnection(sqliteConnectionString);
            await c.OpenAsync();
            return c;
        }

        static DbCommand Command(DbConnection c, string sql, params (string, object)[] parameters)
        {
            DbCommand cmd = c.CreateCommand();
            cmd.CommandText = sql;
            foreach ((string name, object value) in parameters)
            {
                DbParameter p = cmd.CreateParameter();
                p.ParameterName = name;
                p.Value = value ?? DBNull.Value;
                cmd.Parameters.Add(p);
            }
            return cmd;
        }

        /// <summary>Creates the tables and stocks PRODUCTS products (the same every run); several
        /// instances may do it at once on one PostgreSQL database.</summary>
        public async Task Migrate(int products)
        {
            await using DbConnection c = await OpenConnection();
            ServerVersion = c.ServerVersion;
            string orderId = postgres != null ? "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY" : "INTEGER PRIMARY KEY AUTOINCREMENT";
            if (postgres == null)
                await Command(c, "PRAGMA journal_mode=WAL").ExecuteNonQueryAsync();
            await using DbTransaction tx = await c.BeginTransactionAsync();
            if (postgres != null)
                await Command(c, "SELECT pg_advisory_xact_lock(4545)").ExecuteNonQueryAsync();
            foreach (string ddl in new[]
            {
                "CREATE TABLE IF NOT EXISTS products (id BIGINT PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price_cents BIGINT NOT NULL)",
                "CREATE TABLE IF NOT EXISTS orders (id " + orderId + ", product_id BIGINT NOT NULL, quantity INTEGER NOT NULL, " +
                "total_cents BIGINT NOT NULL, coupon TEXT, placed_at TEXT NOT NULL, instance TEXT NOT NULL)",
            })
                await Command(c, ddl).ExecuteNonQueryAsync();
            for (int i = 1; i <= products; i++)
            {
                Product p = Catalogue.Generate(i);
                await Command(c, "INSERT INTO products (id, name, category, price_cents) VALUES (@id, @name, @category, @price) ON CONFLICT (id) DO NOTHING",
                    ("id", p.Id), ("name", p.Name), ("category", p.Category), ("price", p.PriceCents)).ExecuteNonQueryAsync();
            }
            await tx.CommitAsync();
        }

        public async Task<List<Product>> Search(string text)
        {
            await using DbConnection c = await OpenConnection();
            await using DbDataReader r = await Command(c,
                "SELECT id, name, category, price_cents FROM products WHERE lower(name) LIKE @pattern OR lower(category) LIKE @pattern ORDER BY id LIMIT 20",
                ("pattern", "%" + (text ?? "").ToLowerInvariant() + "%")).ExecuteReaderAsync();
            var found = new List<Product>();
            while (await r.ReadAsync()) found.Add(Read(r));
            return found;
        }

        public async Task<Product> Get(long id)
        {
            await using DbConnection c = await OpenConnection();
            await using DbDataReader r = await Command(c, "SELECT id, name, category, price_cents FROM products WHERE id = @id", ("id", id)).ExecuteReaderAsync();
            return await r.ReadAsync() ? Read(r) : null;
        }

        public async Task<long> InsertOrder(long productId, int quantity, long totalCents, string coupon)
        {
            await using DbConnection c = await OpenConnection();
            object id = await Command(c,
                "INSERT INTO orders (product_id, quantity, total_cents, coupon, placed_at, instance) VALUES (@product, @quantity, @total, @coupon, @at, @instance) RETURNING id",
                ("product", productId), ("quantity", quantity), ("total", totalCents), ("coupon", coupon),
                ("at", DateTime.UtcNow.ToString("o", CultureInfo.InvariantCulture)), ("instance", Instance)).ExecuteScalarAsync();
            return Convert.ToInt64(id, CultureInfo.InvariantCulture);
        }

        static Product Read(DbDataReader r)
        {
            return new Product { Id = r.GetInt64(0), Name = r.GetString(1), Category = r.GetString(2), PriceCents = r.GetInt64(3) };
        }

        public void Dispose()
        {
            postgres?.Dispose();
            if (sqlitePath != null)
            {
                SqliteConnection.ClearAllPools();
                foreach (string suffix in new[] { "", "-wal", "-shm" }) File.Delete(sqlitePath + suffix);
            }
        }
    }

    /// <summary>The catalogue's content: product I, the same every run.</summary>
    public static class Catalogue
    {
        static readonly string[] Adjectives = { "Classic", "Organic", "Compact", "Vintage", "Deluxe", "Rugged", "Smart", "Handmade", "Wireless", "Folding" };
        static readonly string[] Nouns = { "Kettle", "Backpack", "Lamp", "Notebook", "Headphones", "Teapot", "Umbrella", "Bicycle Bell", "Chess Set", "Water Bottle" };
        static readonly string[] Categories = { "kitchen", "outdoors", "home", "office", "audio" };

        public static Product Generate(int i)
        {
            return new Product
            {
                Id = i,
                Name = Adjectives[i % 10] + " " + Nouns[(i / 10) % 10] + (i > 100 ? " " + (i / 100 + 1).ToString(CultureInfo.InvariantCulture) : ""),
                Category = Categories[(i * 7) % Categories.Length],
                PriceCents = 499 + (i * 379) % 14500,
            };
        }
    }
}
